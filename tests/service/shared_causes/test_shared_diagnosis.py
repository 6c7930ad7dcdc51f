"""Shared causes through diagnosis's decide step: a switch down or a bad driver rollout is one shared incident whose
members are cordoned and never evicted one by one; faults spread over the fleet, and a member's own fatal Xid, keep
their per-node decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import get_settings
from service.models import Decision, Incident, Job, Node, Rank, SharedIncident
from service.shared_causes import service as shared
from tests import rows
from tests.decide import decide as decide_under
from tests.decide import finding

NOW = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
# Eight of 24 nodes behind one switch is a third of this small fleet: a breaker that admits that many, so these tests
# see the shared cause's own logic (the default share's hold: test_shared_safety.py).
SETTINGS = get_settings().model_copy(update={"breaker_max_share": 0.5})


def decide(session: Session, job: Job, findings: list[Any], now: datetime) -> object:
    return decide_under(session, job, findings, now, SETTINGS)


def _fleet(session: Session) -> list[str]:
    """24 nodes: 8 behind each of three leaf switches; the 8 behind leaf-1 got the new driver."""
    names = [f"gpu-{i:02d}" for i in range(24)]
    for i, name in enumerate(names):
        driver = "560.28.03" if 8 <= i < 16 else "550.54.15"
        rows.node(session, name, labels={"switch": f"leaf-{i // 8}", "driver_version": driver})
    session.flush()
    return names


def _network(node: str, at: datetime, n: int = 0) -> object:
    return finding(node, detector="signatures", category="network", at=at, key=f"ib:{node}:{n}", confidence=0.95)


def _xid(node: str, at: datetime) -> object:
    return finding(node, detector="signatures", category="gpu_hardware", at=at, key=f"xid:{node}", confidence=0.99)


def _decisions(session: Session) -> list[tuple[str, str | None, int | None]]:
    return [
        (kind, name, shared)
        for kind, name, shared in session.execute(
            select(Decision.kind, Node.name, Decision.shared_incident_id)
            .join(Node, Node.id == Decision.node_id)
            .where(Decision.state != "rejected")
            .order_by(Node.name, Decision.kind)
        )
    ]


def test_a_switch_down_is_one_shared_incident_and_no_per_node_eviction(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-shared")
    behind = names[8:16]  # leaf-1's nodes, two flaps each (past the flap tolerance)
    findings = [_network(n, NOW + timedelta(seconds=k), r) for k, n in enumerate(behind) for r in range(2)]
    decide(session, job, findings, NOW + timedelta(seconds=30))
    (incident,) = session.scalars(select(SharedIncident)).all()
    assert (incident.component_kind, incident.component, incident.state) == ("switch", "leaf-1", "open")
    assert sorted(m["node"] for m in incident.members) == behind
    made = _decisions(session)
    assert made == [("cordon", n, incident.id) for n in behind]  # no evict, no diagnose
    assert set(session.scalars(select(Node.state).where(Node.name.in_(behind)))) == {"cordoned"}
    # Another pass with more evidence: still one incident, nothing new.
    decide(session, job, [_network(n, NOW + timedelta(seconds=40), 3) for n in behind], NOW + timedelta(seconds=60))
    assert len(session.scalars(select(SharedIncident)).all()) == 1
    assert _decisions(session) == made


def test_a_bad_driver_rollout_is_one_shared_incident_not_eight_evictions(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-rollout")
    rolled = names[8:16]
    decide(
        session, job, [_xid(n, NOW + timedelta(seconds=k)) for k, n in enumerate(rolled)], NOW + timedelta(seconds=20)
    )
    (incident,) = session.scalars(select(SharedIncident)).all()
    # The switch throws no Xid: the driver the same nodes run is named.
    assert (incident.component_kind, incident.component) == ("driver", "560.28.03")
    assert _decisions(session) == [("cordon", n, incident.id) for n in rolled]


def test_a_members_own_fatal_xid_keeps_its_eviction(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-shared-xid")
    behind = names[8:16]
    findings = [_network(n, NOW + timedelta(seconds=k), r) for k, n in enumerate(behind) for r in range(2)]
    decide(session, job, [*findings, _xid(behind[2], NOW)], NOW + timedelta(seconds=30))
    made = _decisions(session)
    assert [d for d in made if d[0] != "cordon"] == [("evict", behind[2], None)]
    assert len([d for d in made if d[0] == "cordon"]) == 8


def test_faults_spread_over_the_fleet_decide_per_node(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-spread")
    spread = [names[1], names[17], names[20]]  # three Xids on the old driver, which 16 of the 24 nodes run
    decide(
        session, job, [_xid(n, NOW + timedelta(seconds=k)) for k, n in enumerate(spread)], NOW + timedelta(seconds=20)
    )
    assert session.scalars(select(SharedIncident)).all() == []
    assert _decisions(session) == [("evict", n, None) for n in spread]


def test_a_waiting_eviction_before_the_group_formed_is_superseded(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-early")
    rolled = names[8:16]
    # The first node's Xid arrives a pass before the others': decided alone, then superseded by the rollout's incident.
    decide(session, job, [_xid(rolled[0], NOW)], NOW + timedelta(seconds=5))
    assert [(k, n) for k, n, _ in _decisions(session)] == [("evict", rolled[0])]
    later = [_xid(n, NOW + timedelta(seconds=10 + k)) for k, n in enumerate(rolled[1:])]
    decide(session, job, later, NOW + timedelta(seconds=40))
    assert {kind for kind, _, _ in _decisions(session)} == {"cordon"}
    superseded = session.scalar(select(Decision).where(Decision.kind == "evict"))
    assert superseded is not None and superseded.state == "rejected"
    assert "shared incident" in (superseded.outcome_message or "")


def test_a_members_incident_opened_before_the_group_resolves_and_later_findings_join_no_job_incident(
    session: Session,
) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-early-incident")
    rolled = names[8:16]
    decide(session, job, [_xid(rolled[0], NOW)], NOW + timedelta(seconds=5))
    (early,) = session.scalars(select(Incident).where(Incident.job_id == job.id)).all()
    later = [_xid(n, NOW + timedelta(seconds=10 + k)) for k, n in enumerate(rolled[1:])]
    decide(session, job, later, NOW + timedelta(seconds=40))
    session.refresh(early)
    assert early.state == "resolved" and "shared incident" in (early.resolution or "")
    # The members' Xids are the driver's: the job has no incident of its own about them.
    assert [i.state for i in session.scalars(select(Incident).where(Incident.job_id == job.id))] == ["resolved"]


def test_the_jobs_victims_of_a_shared_cause_open_no_incident_of_unknown_blame(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-victims")
    rolled = names[8:16]
    session.add_all(
        [Rank(job_id=job.id, rank=k, node_id=session.scalar(select(Node.id).where(Node.name == n)))
         for k, n in enumerate([*rolled, names[0]])]
    )  # fmt: skip
    session.flush()
    decide(
        session, job, [_xid(n, NOW + timedelta(seconds=k)) for k, n in enumerate(rolled)], NOW + timedelta(seconds=20)
    )
    # The job's other node (names[0], no member) times out waiting: a victim's symptom, the driver's doing.
    victims = finding(
        None, detector="signatures", category="job_failure", at=NOW + timedelta(seconds=40), key="watchdog",
        role="symptom", evidence={"nodes": [names[0]]},
    )  # fmt: skip
    decide(session, job, [victims], NOW + timedelta(seconds=60))
    assert session.scalars(select(Incident).where(Incident.job_id == job.id)).all() == []


def _leaf_down_then_replaced(
    session: Session, job_name: str, *, replaced_s: float
) -> tuple[Job, list[str], SharedIncident]:
    """leaf-1's eight nodes fail together, then a person resolves its shared incident `replaced_s` after NOW."""
    names = _fleet(session)
    job = rows.job(session, job_name)
    behind = names[8:16]
    decide(
        session,
        job,
        [_network(n, NOW + timedelta(seconds=k)) for k, n in enumerate(behind)],
        NOW + timedelta(seconds=20),
    )
    (first,) = session.scalars(select(SharedIncident)).all()
    shared.resolve_by_hand(
        session, incident_id=first.id, reason="leaf-1 replaced", actor="ops", now=NOW + timedelta(seconds=replaced_s)
    )
    return job, behind, first


def test_the_aftermath_of_a_repaired_component_opens_no_second_incident(session: Session) -> None:
    job, behind, first = _leaf_down_then_replaced(session, "llm-aftermath", replaced_s=290)
    # Its links come back up after the repair, past the first findings' window: the counters' flaps on every member.
    later = [_network(n, NOW + timedelta(seconds=320 + k), 5) for k, n in enumerate(behind)]
    decide(session, job, later, NOW + timedelta(seconds=340))
    assert [i.id for i in session.scalars(select(SharedIncident))] == [first.id]
    assert session.scalars(select(Incident).where(Incident.job_id == job.id, Incident.state != "resolved")).all() == []


def test_the_same_component_failing_again_after_its_repair_is_a_new_incident(session: Session) -> None:
    job, behind, _ = _leaf_down_then_replaced(session, "llm-again", replaced_s=30)
    # Ten minutes later it fails again: a new incident, not the first one's aftermath.
    again = [_network(n, NOW + timedelta(seconds=630 + k), 7) for k, n in enumerate(behind)]
    decide(session, job, again, NOW + timedelta(seconds=650))
    incidents = session.scalars(select(SharedIncident).order_by(SharedIncident.id)).all()
    assert [(i.component, i.state) for i in incidents] == [("leaf-1", "resolved"), ("leaf-1", "open")]


def test_a_rival_blamed_on_partial_evidence_is_superseded_and_takes_no_later_fault(session: Session) -> None:
    """A driver rollout's first Xids arrive before its nodes report the new version: the pass blames their power
    domain (3 of its 4 nodes). The next pass, with the new version reported and the fourth node's Xid, names the
    driver over 4 nodes: the power domain's incident is superseded, not left open. Once the driver's incident is
    resolved (and the version rolled back), a lone Xid on the domain's fourth node joins no power incident."""
    names = [f"pd-{i:02d}" for i in range(24)]
    nodes = {n: rows.node(session, n, labels={"power_domain": f"pdu-{i // 4}", "driver_version": "550.54.15"})
             for i, n in enumerate(names)}  # fmt: skip
    job = rows.job(session, "llm-pdu")
    rolled = [names[0], names[2], names[3], names[4]]
    decide(
        session,
        job,
        [_xid(n, NOW + timedelta(seconds=k)) for k, n in enumerate(rolled[:3])],
        NOW + timedelta(seconds=10),
    )
    (rival,) = session.scalars(select(SharedIncident)).all()
    assert (rival.component_kind, rival.component) == ("power_domain", "pdu-0")
    for n in rolled:
        nodes[n].labels = {**nodes[n].labels, "driver_version": "560.28.03"}
    session.flush()
    decide(session, job, [_xid(rolled[3], NOW + timedelta(seconds=5))], NOW + timedelta(seconds=20))
    session.refresh(rival)
    driver = session.scalars(select(SharedIncident).where(SharedIncident.component_kind == "driver")).one()
    assert (driver.component, driver.state) == ("560.28.03", "open")
    assert sorted(m["node"] for m in driver.members) == sorted(rolled)
    assert rival.state == "resolved" and f"superseded by shared incident {driver.id}" in rival.resolution
    shared.resolve_by_hand(
        session, incident_id=driver.id, reason="rolled back", actor="ops", now=NOW + timedelta(seconds=40)
    )
    for n in rolled:
        nodes[n].labels = {**nodes[n].labels, "driver_version": "550.54.15"}
    session.flush()
    decide(session, job, [_xid(names[1], NOW + timedelta(seconds=190))], NOW + timedelta(seconds=200))
    assert session.scalars(select(SharedIncident).where(SharedIncident.state == "open")).all() == []
    assert len(session.scalars(select(SharedIncident)).all()) == 2
    # pd-01's own Xid is its own: a per-node decision, not the power domain's cordon.
    assert ("evict", names[1], None) in _decisions(session)
