"""Issue 43's NVL72 target, live: a switch tray of a simulated NVL72 rack fails while a job trains on its trays; the
trays' real agents read the counters from the fake dcgm-exporter and their GPUs' fabric info through (fake) NVML
beside it, as on a GB200 tray, and ship to a real API; a real worker diagnoses. Expected: one NVLink-domain incident,
its decision at the domain's level (every tray cordoned), no tray evicted, and `faultline eval`'s scoring says so."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from lab.evaluation.api import Api
from lab.evaluation.records import GroundTruth
from lab.evaluation.scoring import score_scenario
from lab.sim.config import SimConfig
from service.config import get_settings
from service.tokens import service as tokens
from tests.e2e.simthread import sim_running
from tests.procs import api_server, running, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TRAYS = 4
FAULT_AFTER = 8.0  # the agents up first (their start takes seconds on a busy machine)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    with (
        api_server(log=tmp_path / "api.log") as url,
        running(["faultline", "work", "--beat", "--concurrency", "2"], log=tmp_path / "worker.log"),
    ):
        yield url


def _rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params))


def _decisions(engine: Engine, prefix: str) -> list[Any]:
    return _rows(
        engine,
        "SELECT n.name, d.kind, d.state, d.shared_incident_id FROM decisions d JOIN nodes n ON n.id = d.node_id "
        "WHERE n.name LIKE :p ORDER BY n.name, d.kind",
        p=f"{prefix}%",
    )


def test_a_switch_tray_failure_is_one_domain_incident_that_cordons_the_rack_and_evicts_no_tray(
    api: str, committed: Engine, tmp_path: Path
) -> None:
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent", name="sim agents").token
        operator = tokens.create(session, scope="operator", name="eval").token
        session.commit()
    prefix, job_id = f"nvl{uuid.uuid4().hex[:6]}-tray", f"sim-nvl-{uuid.uuid4().hex[:6]}"
    config = SimConfig(
        nodes=TRAYS, gpus_per_node=4, scenario="nvswitch_tray_failure", seed=5, job_id=job_id, node_prefix=prefix,
        dir=tmp_path / "sim", agents=True, server=api, token=agent, fault_after=FAULT_AFTER, interval=1.0,
    )  # fmt: skip
    domain = ""
    try:
        with sim_running(config):
            # The ground truth file, not the cluster: the simulator writes the fault there on its next tick (a loaded
            # machine read the file between the two and found no fault yet).
            truth_file = tmp_path / "sim" / "ground_truth.json"
            wait_for(
                lambda: truth_file.exists() and bool(json.loads(truth_file.read_text())["faults"]),
                what="the fault in the ground truth",
                timeout=60,
            )
            truth = json.loads(truth_file.read_text())
            (fault,) = truth["faults"]
            domain, trays = fault["nvlink_domain"], fault["trays"]
            assert len(trays) == TRAYS

            def cordoned() -> set[str]:
                return {n for n, kind, _, shared in _decisions(committed, prefix) if kind == "cordon" and shared}

            wait_for(lambda: cordoned() == set(trays), what="the domain's cordons", timeout=90)
            decided = time.monotonic()
            # Past the trays' settling time: a tray decided on its own would have been by now.
            settle = get_settings().nvlink_domain_settle_s
            while time.monotonic() - decided < settle + 5:
                assert [d for d in _decisions(committed, prefix) if d[1] != "cordon"] == []
                time.sleep(1.0)

            # The agents read the fabric info beside the exporter: every GPU of the rack in the domain, degraded.
            gpus = _rows(
                committed,
                "SELECT g.fabric_cluster_uuid, g.fabric_health, g.fabric_degraded_bw FROM gpus g "
                "JOIN nodes n ON n.id = g.node_id WHERE n.name LIKE :p",
                p=f"{prefix}%",
            )
            assert len(gpus) == TRAYS * 4 and {g[0] for g in gpus} == {domain}
            assert {(g[1], g[2]) for g in gpus} == {("limited_capacity", True)}
            shared = _rows(committed, "SELECT id, component_kind, component, state FROM shared_incidents")
            assert [s[1:] for s in shared] == [("nvlink_domain", domain, "open")]
            decisions = _decisions(committed, prefix)
            assert [(n, kind, incident) for n, kind, _, incident in decisions] == [
                (t, "cordon", shared[0][0]) for t in sorted(trays)
            ]
            # Pending, or held for a person where the fleet's guard rails cap how many machines go at once.
            assert {state for _, _, state, _ in decisions} <= {"pending", "awaiting_approval"}
            # No incident of the job blames a tray's NVLink: the domain's incident explains their findings.
            blamed = _rows(
                committed,
                "SELECT i.id, i.root_cause FROM incidents i JOIN jobs j ON j.id = i.job_id WHERE j.external_id = :j "
                "AND i.root_cause IN ('nvlink', 'straggler')",
                j=job_id,
            )
            assert blamed == []

            # The scheduler's view of the domain, and the eval's scoring of the run through the API it reads.
            headers = {"Authorization": f"Bearer {operator}"}
            view = httpx.get(f"{api}/api/v1/nvlink-domains/{domain}", headers=headers, timeout=10).json()
            assert (view["state"], view["usable_nodes"]) == ("failed", [])
            client = Api(api, operator)
            try:
                listed = client.decisions(job_id)
                listed += [d for d in client.shared_cordons(trays) if d["id"] not in {x["id"] for x in listed}]
                score = score_scenario(GroundTruth.from_json(truth), listed, client.incidents(job_id), seed=5)
            finally:
                client.close()
            assert score.correct and score.detected and score.notes == []
            assert (score.evicted, score.false_accusations, score.domain_cordoned) == ([], [], sorted(trays))
            assert score.shared_incidents == 1 and score.blame_decided == "infrastructure"
            assert score.time_to_decision_s is not None and score.time_to_decision_s < 60
            print(f"nvswitch_tray_failure live: {fault['switch_tray']} failed, domain {domain}")
            print(f"  shared incident {shared[0][0]}: {view['summary']}")
            print(f"  decisions: {decisions}")
            print(f"  scored: correct, first decision {score.time_to_decision_s:.1f} s after the fault")
    finally:
        if domain:  # the test tables' clean-up leaves shared incidents be
            with committed.begin() as conn:
                conn.execute(text("DELETE FROM shared_incidents WHERE component = :c"), {"c": domain})
