"""The simulated cluster's scheduler stand-in against a real faultline API (uvicorn on the test database): it
long-polls with a scheduler token as the adapters do, swaps a spare in for an evicted node, registers the job's
new rank map, and acknowledges; the ack resolves the incident. Decisions are written straight into the database,
as in the adapters' end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from lab.sim.config import SimConfig
from service.models import Decision, Incident
from tests.e2e.simthread import sim_running
from tests.fakes.decisions import make_decision, read_decision, scheduler_token
from tests.procs import api_server, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with api_server(log=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


def _job(url: str, token: Path, job_id: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
    response = httpx.get(f"{url}/api/v1/jobs/{job_id}", headers=headers, timeout=10)
    return response.json() if response.status_code == 200 else {}


def test_evict_swaps_a_spare_in_registers_the_new_rank_map_and_the_ack_resolves_the_incident(
    api: str, committed: Engine, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    prefix, job_id = f"loop{uuid.uuid4().hex[:6]}-", f"sim-loop-{uuid.uuid4().hex[:6]}"
    config = SimConfig(
        nodes=2, gpus_per_node=2, spares=1, scenario="healthy", seed=3, job_id=job_id, node_prefix=prefix,
        dir=tmp_path / "sim", agents=False, server=api, scheduler_token=token.read_text().strip(),
        restart_seconds=2.0, repair_seconds=600.0,
    )  # fmt: skip
    with sim_running(config) as (runner, lines):
        # The launcher's registration at the start: the job and where its ranks run.
        wait_for(lambda: len(_job(api, token, job_id).get("ranks", [])) == 4, what="the job registered", timeout=30)
        evicted, spare = f"{prefix}001", f"{prefix}002"
        elsewhere = make_decision(committed, node=f"other{prefix}001")  # not this cluster's: left to its scheduler
        decision = make_decision(committed, node=evicted, job=job_id)
        wait_for(lambda: read_decision(api, token, decision)["state"] == "done", what="the ack", timeout=60)

        assert read_decision(api, token, elsewhere)["state"] == "pending"
        acked = read_decision(api, token, decision)
        assert acked["outcome"] == "done" and f"{spare} swapped in" in acked["outcome_message"]
        wait_for(
            lambda: {r["node"] for r in _job(api, token, job_id)["ranks"] if r["rank"] >= 2} == {spare},  # type: ignore[index]
            what="the new rank map",
            timeout=30,
        )
        with Session(committed) as session:
            incident_id = session.scalar(select(Decision.incident_id).where(Decision.id == decision))
            incident = session.get(Incident, incident_id)
            assert incident is not None and incident.state == "resolved"
        cluster = runner.cluster
        assert cluster is not None
        wait_for(lambda: cluster.generation == 1 and cluster.job.state == "running", what="the job restarted")
        assert cluster.place[1] == "repair" and cluster.slots == [0, 2]
        # The launcher of the spare now runs node rank 1's processes; the evicted machine's runs none.
        wait_for(lambda: (tmp_path / "sim" / spare / "ranks.pids").read_text().count("\n") == 3, what="new ranks")
        assert (tmp_path / "sim" / evicted / "ranks.pids").read_text().splitlines()[1:] == []
    assert any("scheduler: evict" in line and "done" in line for line in lines), lines
