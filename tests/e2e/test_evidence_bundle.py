"""Done means (issue 42, bundles): on a real node agent, a bundle stored within 60 s of the decision, under its size
cap. Real API, worker (with beat) and agent processes; the agent follows a kernel log file into which a fatal Xid is
written, has a training process of its own (py-spy dumps it), and fake nvidia-smi, dcgmi and nvidia-bug-report.sh on
its PATH (tests/fixtures/bundle: a GPU-less machine has none)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from service.tokens import service as tokens
from tests.factories import batch
from tests.procs import api_server, running, wait_for

pytestmark = pytest.mark.slow

NODE = "gpu-node-017"
JOB = "llm-pretrain-42"
FAKE_BIN = Path(__file__).parent.parent / "fixtures" / "bundle" / "bin"
CAP = 20 * 1024 * 1024


def _xid_now() -> str:
    """The fatal Xid as the kernel would print it now: its stamp is seconds since boot, which the agent turns into
    wall time (a fixed stamp would be minutes old, or in the future, by how long this machine has been up)."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return (
        f"[{uptime:12.6f}] NVRM: Xid (PCI:0000:3b:00): 79, pid=4321, name=python, GPU has fallen off the bus.\n"
        f"[{uptime:12.6f}] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
    )


def test_an_eviction_gets_the_nodes_bundle_stored_within_60_s_under_its_cap(committed, tmp_path: Path) -> None:
    factory = sessionmaker(bind=committed)
    with factory() as session:
        agent_token = tokens.create(session, scope="agent", node_name=NODE).token
        operator = tokens.create(session, scope="operator", name="oncall").token
        session.commit()
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("[ 4200.000001] nvidia-nvlink: Nvlink Core is being initialized\n")
    env = {"FAULTLINE_BUNDLE_MAX_BYTES": str(CAP)}
    # A training process as torchrun starts one: the agent finds it by its environment and names the job by it.
    trainer_env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "FAULTLINE_JOB_ID": JOB}
    code = "import time\ndef train_step():\n    time.sleep(600)\ntrain_step()\n"
    trainer = subprocess.Popen([sys.executable, "-c", code], env=trainer_env)
    try:
        with (
            api_server(env=env, log=tmp_path / "api.log") as url,
            running(["faultline", "work", "--beat", "--concurrency", "2"], env=env, log=tmp_path / "worker.log"),
        ):
            agent_args = [
                "faultline", "agent", "--server", url, "--node-name", NODE, "--kmsg", str(kmsg),
                "--ship-interval", "1", "--watch-pid", str(trainer.pid),
                "--spool-dir", str(tmp_path / "spool"),
            ]  # fmt: skip
            agent_env = {
                "FAULTLINE_AGENT_TOKEN": agent_token,
                "FAULTLINE_AGENT_PROCESS_INTERVAL": "1",
                "PATH": f"{FAKE_BIN}:{os.environ['PATH']}",
            }
            agent_log = tmp_path / "agent.log"
            with running(agent_args, env=agent_env, log=agent_log):
                api = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {operator}"})
                # The agent has reported the training process (the job exists) before the fault.
                wait_for(lambda: api.get(f"/api/v1/jobs/{JOB}").status_code == 200, timeout=60, what="the job")
                with kmsg.open("a") as handle:
                    handle.write(_xid_now())

                def evict_id() -> int | None:
                    with committed.connect() as conn:
                        return conn.execute(
                            text("SELECT id FROM decisions WHERE kind = 'evict' ORDER BY id LIMIT 1")
                        ).scalar()

                wait_for(lambda: evict_id() is not None, timeout=90, what="the evict decision")
                incident_id = api.get(f"/api/v1/decisions/{evict_id()}").json()["incident_id"]

                def stored() -> list[dict]:
                    answer = api.get(f"/api/v1/incidents/{incident_id}/bundles")
                    return [b for b in answer.json() if b["state"] == "stored"]

                wait_for(lambda: bool(stored()), timeout=90, what="the stored bundle")
                [bundle] = stored()
                download = api.get(bundle["download"])
    finally:
        trainer.kill()
        trainer.wait()

    with committed.connect() as conn:
        decided_at, stored_at, size = conn.execute(
            text(
                "SELECT d.created_at, b.stored_at, b.size_bytes FROM evidence_bundles b "
                "JOIN decisions d ON d.id = b.decision_id WHERE b.id = :id"
            ),
            {"id": bundle["id"]},
        ).one()
    seconds = (stored_at - decided_at).total_seconds()
    manifest = bundle["manifest"]
    print(f"\ndecision {bundle['decision_id']} -> bundle stored in {seconds:.1f} s, {size} bytes (cap {CAP})")
    print(json.dumps(manifest, indent=1))

    assert seconds < 60, f"the bundle was stored {seconds:.1f} s after the decision"
    assert bundle["seconds_after_decision"] == pytest.approx(seconds, abs=0.01)
    assert size <= CAP and len(download.content) == size
    assert download.status_code == 200
    parts = {p["name"]: p for p in manifest["parts"]}
    assert manifest["node"] == NODE and manifest["decision_id"] == bundle["decision_id"]
    for name in ("kernel_log", "agent_samples", "nvidia_smi", "dcgmi_diag", "nvidia_bug_report", "py_spy"):
        assert parts[name]["status"] == "ok", parts[name]
    with tarfile.open(fileobj=io.BytesIO(download.content), mode="r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert b"GPU has fallen off the bus" in files["kernel.log"], "the kernel log holds the fault"
    assert b"Driver Version" in files["nvidia-smi-q.txt"]
    dumps = json.loads(files["py-spy.json"])
    assert any(f["name"] == "train_step" for d in dumps for t in d.get("threads", []) for f in t["frames"])
    assert JOB.encode() in files["agent-samples.jsonl"], "the agent's last batches name the job"
    assert "bundle uploaded (HTTP 201)" in agent_log.read_text()


def test_a_node_without_a_running_agent_reads_no_bundle_agent_unreachable(committed, tmp_path: Path) -> None:
    """The node's batch with its fatal Xid arrives (then its agent dies): the decision's bundle is asked for, nothing
    answers, and once the time is up the incident says so instead of showing nothing."""
    factory = sessionmaker(bind=committed)
    with factory() as session:
        agent_token = tokens.create(session, scope="agent", node_name=NODE).token
        operator = tokens.create(session, scope="operator", name="oncall").token
        session.commit()
    env = {"FAULTLINE_BUNDLE_TIMEOUT_S": "2", "FAULTLINE_BUNDLE_GRACE_S": "1"}
    with (
        api_server(env=env, log=tmp_path / "api.log") as url,
        running(["faultline", "work", "--beat", "--concurrency", "2"], env=env, log=tmp_path / "worker.log"),
    ):
        api = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {operator}"})
        fault = batch(NODE, gpus=2, job_id=JOB)
        sent = api.post("/api/v1/ingest", json=fault, headers={"Authorization": f"Bearer {agent_token}"})
        assert sent.status_code == 200, sent.text

        def bundles() -> list[dict]:
            with committed.connect() as conn:
                incident = conn.execute(text("SELECT incident_id FROM evidence_bundles")).scalar()
            return api.get(f"/api/v1/incidents/{incident}/bundles").json() if incident else []

        wait_for(lambda: bool(bundles()), timeout=60, what="the bundle request")
        wait_for(lambda: bundles()[0]["state"] == "unreachable", timeout=30, what="the unreachable state")
        [bundle] = bundles()
        assert bundle["status"].startswith("no bundle: agent unreachable") and bundle["download"] is None
        assert bundle["decision_kind"] == "evict" and bundle["node"] == NODE
