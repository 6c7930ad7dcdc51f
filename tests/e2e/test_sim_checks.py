"""The demo's closed loop with stop-time checks, against a real faultline API: the simulated cluster's scheduler
drains a node for a diagnose decision, the service sends that node's real agent run_checks, the agent runs its real
suite on the node's simulated GPUs (fake NVML and PyTorch answering from the node's fault, lab/sim/fakegpu) and
ships the results through the ingest API, and the service's verdict (here an eviction: the node's GPU corrupts
data) comes back to the scheduler, which sends the node to repair."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from lab.sim import gpustate
from lab.sim.config import SimConfig
from service.models import CheckResult, Decision
from service.tokens import service as tokens
from tests.e2e.simthread import sim_running
from tests.fakes.decisions import make_decision, read_decision, scheduler_token
from tests.procs import api_server, wait_for

pytestmark = pytest.mark.slow
PORT = 19152  # this worktree's range


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    with api_server(log=tmp_path / "api.log", port=PORT) as url:
        yield url


def test_a_diagnosed_node_answers_its_checks_from_its_fault_and_the_verdict_evicts_it(
    api: str, committed: Engine, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent", name="sim agents").token
        session.commit()
    prefix, job_id = f"chk{uuid.uuid4().hex[:6]}-", f"sim-chk-{uuid.uuid4().hex[:6]}"
    config = SimConfig(
        nodes=2, gpus_per_node=2, spares=1, scenario="sdc", seed=3, job_id=job_id, node_prefix=prefix,
        dir=tmp_path / "sim", agents=True, server=api, token=agent, scheduler_token=token.read_text().strip(),
        restart_seconds=2.0, repair_seconds=600.0, check_seconds=3.0, fault_after=2.0, interval=1.0,
        service_checks=True,
    )  # fmt: skip
    with sim_running(config) as (runner, lines):
        wait_for(lambda: runner.cluster is not None and bool(runner.cluster.faults), what="the fault", timeout=60)
        cluster = runner.cluster
        assert cluster is not None
        machine = cluster.faults[0].machine
        assert machine is not None
        name = cluster.node_names[machine]
        diagnose = make_decision(committed, node=name, kind="diagnose", job=job_id, reason="loss spikes on one node")
        wait_for(lambda: read_decision(api, token, diagnose)["state"] == "done", what="the drain", timeout=60)
        assert cluster.place[machine] in ("check", "repair")

        def evicted() -> int | None:
            with Session(committed) as session:
                return session.scalar(
                    select(Decision.id).where(Decision.kind == "evict", Decision.state == "done", Decision.reason.like(
                        f"stop-time checks failed on {name}%"))
                )  # fmt: skip

        wait_for(lambda: evicted() is not None, what="the checks' eviction, acted on", timeout=120)
        assert cluster.place[machine] == "repair"
        with Session(committed) as session:
            failed = session.scalars(select(CheckResult.check).where(CheckResult.verdict == "fail")).all()
        assert "numerics" in failed
        results = tmp_path / "sim" / name / gpustate.STATE_FILE
        wait_for(lambda: not results.exists(), what="the answers gone once the machine left its check", timeout=10)
    assert any(f"{name}: its checks ran" in line for line in lines), lines
