"""A simulated machine answers run_checks from its fault (lab/sim/checks.py) through the service's own function
(service/checks/loop.py `accept`), in-process at simulated time as the campaign does (campaign_checks.py): the
service's verdict (evict, reset_gpu, return) is what the closed loop then acts on. Real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from lab.evaluation.campaign_checks import CheckDesk
from lab.sim import checks as sim_checks
from lab.sim.actions import act
from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from service.config import get_settings
from service.decisions.lifecycle import acknowledge
from service.models import CheckResult, Decision, Directive, Finding, Incident, Node
from tests import rows

START = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _cluster(scenario: str, *, nodes: int = 6, spares: int = 2, gpus: int = 4) -> Cluster:
    config = SimConfig(
        nodes=nodes, gpus_per_node=gpus, scenario=scenario, seed=7, fault_after=10.0, start=START, spares=spares,
        service_checks=True, node_prefix=f"sim-{scenario}-",
    )  # fmt: skip
    c = Cluster(config)
    c.advance(60.0)
    return c


def _diagnose(session, c: Cluster, name: str) -> Decision:
    node = session.scalar(select(Node).where(Node.name == name))
    incident = rows.incident(session, job=rows.job(session), suspects=[name], root_cause="straggler", state="open")
    return rows.decision(session, incident=incident, node=node, kind="diagnose", reason="a GPU less busy than peers")


def _loop(session, c: Cluster, decision: Decision, now: datetime) -> tuple[CheckDesk, list[Decision]]:
    """The campaign's loop: the scheduler drains the node, its checks run, the service concludes on them."""
    settings = get_settings()
    desk = CheckDesk(settings, job_id="j", seconds=120.0)
    desk.commissioned = True
    node = session.get(Node, decision.node_id)
    assert act(c, {"kind": "diagnose", "node": node.name}).ack == "done"
    acknowledge(
        session, decision_id=decision.id, outcome="done", message="drained", actor="sim", now=now, settings=settings
    )
    desk.after_ack(session, c, decision_id=decision.id, node=node.name, t=60.0)
    assert [p.decision_id for p in desk.pending] == [decision.id]
    assert desk.deliver_due(session, c, t=100.0, now=now) == []  # still running
    made = desk.deliver_due(session, c, t=180.0, now=now + timedelta(seconds=120))
    return desk, [session.get(Decision, d) for d in made]


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)  # simulated time lies in the past


def _nodes(session, c: Cluster) -> None:
    for name in c.node_names:
        rows.node(session, name)


def test_a_thermal_straggler_fails_its_checks_and_the_service_evicts_it(session, now) -> None:
    # Two GPUs a node, as in the campaign: too few for the agent's own node median, so the fleet judges the GEMM.
    c = _cluster("straggler", gpus=2)
    _nodes(session, c)
    desk = CheckDesk(get_settings(), job_id="j", seconds=120.0)
    desk.tick(session, c, t=60.0, now=now - timedelta(minutes=5))  # the acceptance burn-in: the fleet's history
    assert desk.commissioned
    machine = c.faults[0].machine
    assert machine is not None
    name = c.node_names[machine]
    diagnose = _diagnose(session, c, name)
    desk, made = _loop(session, c, diagnose, now)
    [evict] = [d for d in made if d.kind == "evict"]
    assert evict.state == "pending" and evict.incident_id == diagnose.incident_id
    [record] = desk.records
    assert record.outcome == "evict" and record.faulty and record.settled
    assert {"nvml_state", "gemm_bf16"} <= set(record.failed_checks)
    # The slow GPU's GEMM failed at the service against the fleet's cut-off, not the spec floor.
    gpu = c.faults[0].gpus[name][0]
    gemm = session.scalar(
        select(CheckResult).where(
            CheckResult.check == "gemm_bf16", CheckResult.subject == f"gpu:{gpu}", CheckResult.directive_id.is_not(None)
        )
    )
    assert gemm.verdict == "fail" and gemm.basis == "fleet" and gemm.evidence["fleet"]["shortfall"] > 0.2
    assert gemm.finding_id is not None
    finding = session.get(Finding, gemm.finding_id)
    assert finding.incident_id == diagnose.incident_id  # the incident's evidence holds what the checks found
    # The closed loop acts on the service's verdict: the machine goes to repair, not back to the pool.
    assert act(c, {"kind": "evict", "node": name}).ack == "done"
    assert c.place[machine] == "repair"


def test_a_healthy_node_passes_and_the_service_returns_it_and_resolves_the_incident(session, now) -> None:
    c = _cluster("healthy")
    _nodes(session, c)
    name = c.node_names[1]
    diagnose = _diagnose(session, c, name)
    desk, made = _loop(session, c, diagnose, now)
    assert [d.kind for d in made] == ["return"]
    [record] = desk.records
    assert record.outcome == "return" and not record.faulty and record.failed_checks == () and record.settled
    assert session.get(Incident, diagnose.incident_id).state == "resolved"
    directive = session.scalar(select(Directive).where(Directive.kind == "run_checks"))
    assert directive.params["concluded"].startswith("passed: node returned")
    assert act(c, {"kind": "return", "node": name}).ack == "done"
    assert c.place[1] == "spare"


@pytest.mark.parametrize(
    ("scenario", "kind", "check"),
    [
        ("gpu_lost", "evict", "nvml_state"),
        ("row_remap_pending", "reset_gpu", "nvml_state"),
        ("nic_down", "evict", "ib_port"),
        ("sdc", "evict", "numerics"),
        ("host_mem_pressure", "evict", "memory_available"),
    ],
)
def test_each_fault_fails_the_check_that_would_find_it(session, now, scenario: str, kind: str, check: str) -> None:
    c = _cluster(scenario)
    _nodes(session, c)
    machine = c.faults[0].machine
    assert machine is not None
    desk, made = _loop(session, c, _diagnose(session, c, c.node_names[machine]), now)
    assert [d.kind for d in made] == [kind]
    assert check in desk.records[0].failed_checks


def test_a_machine_that_left_its_check_refuses_and_nobody_is_evicted(session, now) -> None:
    c = _cluster("healthy")
    _nodes(session, c)
    name = c.node_names[2]
    diagnose = _diagnose(session, c, name)
    settings = get_settings()
    desk = CheckDesk(settings, job_id="j", seconds=120.0)
    desk.commissioned = True
    act(c, {"kind": "diagnose", "node": name})
    acknowledge(session, decision_id=diagnose.id, outcome="done", message="", actor="sim", now=now, settings=settings)
    desk.after_ack(session, c, decision_id=diagnose.id, node=name, t=60.0)
    act(c, {"kind": "evict", "node": name})  # a person sent it to repair meanwhile
    assert desk.deliver_due(session, c, t=200.0, now=now) == []
    assert desk.records[0].outcome == "none" and not desk.records[0].settled


def test_the_simulated_fleet_passes_and_a_gpu_20_percent_slow_fails_the_fleet_cut_off() -> None:
    from ml.check_criteria import judge

    c = _cluster("healthy", nodes=8, spares=0)
    figures = [
        r.measured
        for seed in range(3)
        for m in range(c.machines)
        for r in sim_checks.run(c, m, level=2, seed=seed)
        if r.check == "gemm_bf16"
    ]
    assert len(figures) == 96
    fresh = [r for m in range(c.machines) for r in sim_checks.run(c, m, level=2, seed=99)]
    assert [r for r in fresh if r.status == "fail"] == []  # the agent's own judgement
    gemm = [r.measured for r in fresh if r.check == "gemm_bf16"]
    assert all(judge(v, figures).status == "pass" for v in gemm)  # 0 false fails over the simulated fleet
    median = sorted(figures)[len(figures) // 2]
    assert judge(0.8 * median, figures).status == "fail"
