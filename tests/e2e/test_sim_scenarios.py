"""Every simulator scenario end to end: simulated nodes, real agents, the real API, rows in PostgreSQL.

Each fault must reach the service as the evidence it is made of, from the node the ground truth names
(and a healthy run must carry no critical event). Diagnosis itself is tested elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.procs import running, wait_api, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
NODES, GPUS = 2, 2
FAULT_AFTER = 4


def _rows(engine: Any, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params))


def _events(engine: Any, job: str, kind: str) -> list[Any]:
    return _rows(
        engine,
        "SELECT n.name, e.rank, e.fields, e.severity FROM log_events e JOIN nodes n ON n.id = e.node_id "
        "LEFT JOIN jobs j ON j.id = e.job_id WHERE e.kind = :kind AND (j.external_id = :job OR e.job_id IS NULL)",
        kind=kind,
        job=job,
    )


@pytest.fixture
def sim(committed: Any, tmp_path: Path) -> Iterator[Callable[[str], dict[str, Any]]]:
    """Start the API, then `sim(scenario)` starts the simulator with agents and returns its ground truth."""
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent").token
        operator = tokens.create(session, scope="operator").token
        session.commit()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    with running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"):
        wait_api(url)

        def start(scenario: str) -> dict[str, Any]:
            args = [
                sys.executable, "-m", "faultline", "sim", "--scenario", scenario, "--nodes", str(NODES),
                "--gpus-per-node", str(GPUS), "--server", url, "--dir", str(tmp_path / "sim"), "--seed", "11",
                "--fault-after", str(FAULT_AFTER), "--watchdog-seconds", "6",
            ]  # fmt: skip
            log = (tmp_path / "sim.log").open("wb")
            env = {**os.environ, "FAULTLINE_AGENT_TOKEN": agent}
            started.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))
            truth_path = tmp_path / "sim" / "ground_truth.json"
            wait_for(truth_path.exists, what="the ground truth")
            truth = json.loads(truth_path.read_text())
            return {**truth, "url": url, "operator": operator, "dir": tmp_path / "sim", "truth_path": truth_path}

        try:
            yield start
        finally:
            for process in started:
                process.send_signal(signal.SIGINT)
                process.wait(timeout=60)
                assert process.returncode == 0, (tmp_path / "sim.log").read_text()[-3000:]


def _fault(run: dict[str, Any]) -> dict[str, Any]:
    def injected() -> bool:
        return bool(json.loads(run["truth_path"].read_text())["faults"])

    wait_for(injected, timeout=30, what="the injection")
    return json.loads(run["truth_path"].read_text())["faults"][0]


def test_healthy_run_ships_every_gpu_and_step_and_nothing_critical(sim: Any, committed: Any) -> None:
    run = sim("healthy")
    wait_for(lambda: len(_events(committed, run["job_id"], "step")) >= 2 * NODES, timeout=60, what="steps")
    per_gpu = _rows(
        committed,
        "SELECT n.name, m.gpu, count(*) FROM metric_samples m JOIN nodes n ON n.id = m.node_id GROUP BY 1, 2",
    )
    assert {(name, gpu) for name, gpu, _ in per_gpu} == {
        (f"node-{n:03d}", g) for n in range(NODES) for g in range(GPUS)
    }
    critical = _rows(committed, "SELECT kind, line FROM log_events WHERE severity = 'critical'")
    assert critical == []


@pytest.mark.parametrize(
    ("scenario", "kind", "check"),
    [
        ("gpu_lost", "xid", lambda f: f["xid"] == 79),
        ("ecc_dbe", "xid", lambda f: f["xid"] == 48),
        ("nvlink", "xid", lambda f: f["xid"] == 74),
        ("ib_flap", "ib_error", lambda f: f["status"] == 12),
    ],
)
def test_fault_evidence_comes_from_the_faulty_node(
    sim: Any, committed: Any, scenario: str, kind: str, check: Any
) -> None:
    run = sim(scenario)
    fault = _fault(run)
    (faulty,) = fault["nodes"]

    def evidence() -> list[Any]:
        return [e for e in _events(committed, run["job_id"], kind) if check(e[2])]

    wait_for(lambda: bool(evidence()), timeout=30, what=f"{kind} evidence of {scenario}")
    assert {node for node, *_ in evidence()} == {faulty}
    assert all(severity in ("error", "critical") for *_, severity in evidence())
    if scenario == "gpu_lost":
        # The GPU's series vanish from its exporter: its samples stop while its peers' go on.
        (gpu,) = fault["gpus"][faulty]
        last = (
            "SELECT max(m.ts) FROM metric_samples m JOIN nodes n ON n.id = m.node_id WHERE n.name = :n AND m.gpu = :g"
        )
        wait_for(
            lambda: (
                (
                    _rows(committed, last, n=faulty, g=1 - gpu)[0][0] - _rows(committed, last, n=faulty, g=gpu)[0][0]
                ).total_seconds()
                > 3
            ),
            timeout=30,
            what="the lost GPU's samples to stop",
        )


def test_straggler_shows_only_in_the_counters(sim: Any, committed: Any) -> None:
    run = sim("straggler")
    fault = _fault(run)
    (faulty,) = fault["nodes"]
    (gpu,) = fault["gpus"][faulty]
    clocks = (
        "SELECT avg(m.sm_clock) FROM metric_samples m JOIN nodes n ON n.id = m.node_id "
        "WHERE n.name = :n AND m.gpu = :g AND m.ts > CAST(:t AS timestamptz) + interval '2 s'"
    )

    def throttled() -> bool:
        slow = _rows(committed, clocks, n=faulty, g=gpu, t=fault["injected_at"])[0][0]
        healthy_gpu = _rows(committed, clocks, n=faulty, g=1 - gpu, t=fault["injected_at"])[0][0]
        return slow is not None and healthy_gpu is not None and slow < 0.8 * healthy_gpu

    wait_for(throttled, timeout=30, what="the throttled GPU's SM clock")
    assert _rows(committed, "SELECT kind FROM log_events WHERE severity IN ('error', 'critical')") == []


def test_hang_stops_progress_and_stacks_show_the_culprit(sim: Any, committed: Any) -> None:
    run = sim("hang")
    fault = _fault(run)
    (culprit_rank,) = fault["ranks"]
    client = httpx.Client(base_url=run["url"], headers={"Authorization": f"Bearer {run['operator']}"}, timeout=10)
    steps: list[int] = []

    def progress_stopped() -> bool:
        # Step events stop arriving: the same latest step over three seconds of polling.
        latest = max((e[2]["step"] for e in _events(committed, run["job_id"], "step")), default=-1)
        steps.append(latest)
        return len(steps) > 15 and steps[-15] == latest >= 0

    wait_for(progress_stopped, timeout=60, what="step progress to stop")
    wait_for(lambda: client.get(f"/api/v1/jobs/{run['job_id']}").status_code == 200, what="the job")
    created = client.post(f"/api/v1/jobs/{run['job_id']}/stack-dumps", json={"reason": "test"}).json()
    path = f"/api/v1/jobs/{run['job_id']}/stack-dumps/{created['id']}"
    wait_for(
        lambda: len({d["rank"] for d in client.get(path).json()["dumps"]}) == NODES * GPUS,
        timeout=60,
        what="dumps of every rank",
    )
    frames = {d["rank"]: " ".join(d["frames"]) for d in client.get(path).json()["dumps"]}
    assert "_next_data" in frames[culprit_rank]
    assert all("all_reduce" in f for rank, f in frames.items() if rank != culprit_rank)


@pytest.mark.parametrize(("scenario", "kind"), [("user_bug", "traceback"), ("nan_loss", "nan_loss")])
def test_job_level_faults_show_on_every_node(sim: Any, committed: Any, scenario: str, kind: str) -> None:
    run = sim(scenario)
    fault = _fault(run)
    assert fault["nodes"] == [] and fault["expect_eviction"] is False

    def nodes_reporting() -> set[str]:
        return {node for node, *_ in _events(committed, run["job_id"], kind)}

    wait_for(lambda: nodes_reporting() == {f"node-{n:03d}" for n in range(NODES)}, timeout=30, what=kind)
    if scenario == "user_bug":
        messages = {e[2]["exc_message"] for e in _events(committed, run["job_id"], "traceback")}
        assert len(messages) == 1  # the same bug on every rank
