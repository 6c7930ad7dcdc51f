"""`faultline demo` end to end: it comes up, the README's curl examples work against it,
Ctrl-C stops every process, and a second run reuses the data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from service.embedded import free_port
from service.processes import healthy
from tests import paths
from tests.procs import wait_for

pytestmark = pytest.mark.slow
README = paths.REPO / "README.md"

# httpx's default 5 s is too short for a first request (the OpenAPI schema built on demand) on a loaded machine.
HTTP_TIMEOUT_S = 60.0


def _get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, timeout=HTTP_TIMEOUT_S, **kwargs)


def _curl_examples() -> list[str]:
    """The shell blocks of the README's "Try the API against the demo" section, in order."""
    section = README.read_text().split("## Try the API against the demo", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [b for b in blocks if "curl" in b]


def _start_demo(data_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    options = f"--data-dir {data_dir} --port {port} --nodes 2 --fault-after 10".split()
    return subprocess.Popen(
        [sys.executable, "-m", "faultline", "demo", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


# Run in a child process, as `faultline token create --data-dir` does: it reaches the demo's embedded
# PostgreSQL through the data folder, without touching this test process's settings.
_COUNT_FAULT_EVENTS = """
import sys
from pathlib import Path
from sqlalchemy import text
from service.db import session_scope
from service.embedded import use_data_dir

use_data_dir(Path(sys.argv[1]))
with session_scope() as session:
    print(session.execute(text(
        "SELECT count(*) FROM log_events e JOIN nodes n ON n.id = e.node_id "
        "WHERE e.severity IN ('error', 'critical') AND n.name = ANY(:nodes)"
    ), {"nodes": sys.argv[2:]}).scalar_one())
"""


def _fault_events(data_dir: Path, nodes: list[str]) -> bool:
    """Whether error or critical events from the faulty nodes are stored."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_FAULT_EVENTS, str(data_dir), *nodes],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip()) > 0


def _stop(demo: subprocess.Popen[str]) -> str:
    children = psutil.Process(demo.pid).children(recursive=True)
    demo.send_signal(signal.SIGINT)
    output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running after Ctrl-C: {[p.cmdline() for p in alive]}"
    return output


def test_demo_runs_the_readme_examples_and_stops_cleanly(tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    demo = _start_demo(data_dir, port)
    try:
        wait_for(
            lambda: demo.poll() is not None or (healthy(url) and (data_dir / "demo-tokens.json").exists()),
            timeout=120,
            what="the demo",
        )
        assert demo.poll() is None
        tokens = json.loads((data_dir / "demo-tokens.json").read_text())
        assert _get(f"{url}/docs").status_code == 200
        assert "IngestBatch" in _get(f"{url}/openapi.json").text
        assert _get(f"{url}/healthz").json() == {"status": "ok", "database": "ok", "broker": "ok"}

        examples = _curl_examples()
        assert len(examples) == 6
        env = {
            **os.environ,
            "FAULTLINE_URL": url,
            "AGENT_TOKEN": tokens["agent"],
            "SCHEDULER_TOKEN": tokens["scheduler"],
        }

        def run(example: str) -> Any:
            result = subprocess.run(["bash", "-c", example], capture_output=True, text=True, env=env, timeout=30)
            assert result.returncode == 0, f"{example}\n{result.stdout}\n{result.stderr}"
            return json.loads(result.stdout)

        outputs = [run(example) for example in examples[:3]]
        # The batch's Xid 79 is diagnosed by the demo's worker: an eviction of its node appears.
        wait_for(lambda: bool(run(examples[3])["items"]), timeout=60, what="the README's eviction decision")
        (decision,) = run(examples[3])["items"]
        assert (decision["node"], decision["kind"], decision["state"]) == ("gpu-node-001", "evict", "pending")
        assert outputs[0]["job_id"] == "llm-pretrain-42" and outputs[0]["parallelism"]["tp"] == 4
        assert outputs[1]["status"] in ("accepted", "duplicate")
        assert outputs[2]["ranks"][0] == {"rank": 0, "node": "gpu-node-001", "local_rank": 0, "gpu": 0, "pid": 4242}
        # The scheduler acknowledges it: the node is evicted, and a second acknowledgement changes nothing.
        acked = run(examples[4])
        assert (acked["id"], acked["state"], acked["outcome_message"]) == (
            decision["id"],
            "done",
            "cordoned and drained",
        )
        assert run(examples[4]) == acked
        node = run(examples[5])
        assert (node["state"], node["history"][0]["kind"]) == ("evicted", "evict_done")

        # The simulated cluster's agents report its job: 2 nodes x 8 ranks, placed by the agents.
        scheduler = {"Authorization": f"Bearer {tokens['scheduler']}"}

        def demo_job_mapped() -> bool:
            got = _get(f"{url}/api/v1/jobs/demo-job", headers=scheduler)
            return got.status_code == 200 and len(got.json()["ranks"]) == 16

        wait_for(demo_job_mapped, timeout=90, what="the simulated cluster's ranks")
        # The web UI, signed in with the banner's operator token, maps the simulated job's nodes.
        with httpx.Client(base_url=url, follow_redirects=True, timeout=HTTP_TIMEOUT_S) as browser:
            signed_in = browser.post("/login", data={"token": tokens["operator"], "next": "/"})
            assert signed_in.status_code == 200 and "Cluster map" in signed_in.text
            assert 'href="/jobs/demo-job"' in signed_in.text and 'data-node="node-001"' in signed_in.text
        ranks = _get(f"{url}/api/v1/jobs/demo-job", headers=scheduler).json()["ranks"]
        assert {(r["rank"], r["node"]) for r in ranks} == {(r, f"node-{r // 8:03d}") for r in range(16)}

        # A fault arrives: the simulator injects one, and its evidence reaches the service.
        truth_path = data_dir / "sim" / "ground_truth.json"
        wait_for(lambda: bool(json.loads(truth_path.read_text())["faults"]), timeout=60, what="the first fault")
        fault = json.loads(truth_path.read_text())["faults"][0]
        if fault["kind"] != "straggler":  # a throttled GPU writes no log line; its counters show it
            wait_for(lambda: _fault_events(data_dir, fault["nodes"]), timeout=60, what=f"evidence of {fault['kind']}")
        token = subprocess.run(
            [sys.executable, "-m", "faultline", "token", "create", "--scope", "operator", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")},
        )
        assert token.returncode == 0, token.stderr
        assert (
            _get(f"{url}/api/v1/jobs/demo-job", headers={"Authorization": f"Bearer {token.stdout.strip()}"}).status_code
            == 200
        )
    finally:
        if demo.poll() is None:
            output = _stop(demo)
    assert tokens["agent"] in output and "Ctrl-C" in output

    again = _start_demo(data_dir, port)
    try:
        wait_for(lambda: again.poll() is not None or healthy(url), timeout=120, what="the second demo")
        assert json.loads((data_dir / "demo-tokens.json").read_text()) == tokens
        job = _get(f"{url}/api/v1/jobs/llm-pretrain-42", headers={"Authorization": f"Bearer {tokens['scheduler']}"})
        assert job.status_code == 200, "data of the first run was lost"
    finally:
        if again.poll() is None:
            _stop(again)
