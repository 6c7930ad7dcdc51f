"""Shared causes under the fleet's safety rules: the circuit breaker gates their cordons like every automatic take-out
(a switch behind a third of a small fleet trips it, one alert, the rest wait for a person), and a node under planned
maintenance or silenced is no failing member and gets no cordon (as diagnosis treats a silenced node)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.breaker import service as breaker
from service.config import Settings, get_settings
from service.decisions import lifecycle as decisions
from service.models import (
    Decision,
    FleetBreaker,
    MaintenanceWindow,
    Node,
    NotificationChannel,
    NotificationDelivery,
    SharedIncident,
    Silence,
)
from service.planned import service as planned
from service.planned.schemas import WindowIn
from service.shared_causes import service as shared
from service.silences import service as silences
from tests import rows
from tests.decide import decide, finding

NOW = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def _settings(**changes: Any) -> Settings:
    return get_settings().model_copy(
        update={"policy_mode": "act", "breaker_enabled": True, "breaker_max_share": 0.10, "breaker_min_nodes": 3}
        | changes
    )


def _fleet(session: Session) -> list[str]:
    """24 nodes, 8 behind each of three leaf switches."""
    names = [f"gpu-{i:02d}" for i in range(24)]
    for i, name in enumerate(names):
        rows.node(session, name, labels={"switch": f"leaf-{i // 8}"})
    return names


def _ib_errors(nodes: list[str], at: datetime) -> list[Any]:
    """Two IB error findings on each node (past the per-node flap tolerance)."""
    return [
        finding(n, detector="signatures", category="network", at=at + timedelta(seconds=k), key=f"ib:{n}:{r}")
        for k, n in enumerate(nodes)
        for r in range(2)
    ]


def _cordons(session: Session) -> dict[str, str]:
    """Node -> state of its shared cause's cordon."""
    return dict(
        session.execute(
            select(Node.name, Decision.state)
            .join(Decision, Decision.node_id == Node.id)
            .where(Decision.shared_incident_id.is_not(None), Decision.kind == "cordon")
        ).all()
    )


def _states(session: Session, names: list[str]) -> dict[str, str]:
    return dict(session.execute(select(Node.name, Node.state).where(Node.name.in_(names))).all())


def _deliveries(session: Session, event: str) -> list[NotificationDelivery]:
    return list(session.scalars(select(NotificationDelivery).where(NotificationDelivery.event == event)))


def test_a_switch_behind_a_third_of_a_small_fleet_trips_the_breaker_and_holds_the_rest(session: Session) -> None:
    session.add(NotificationChannel(name="oncall", kind="json", url="https://chat.example.com/hook"))
    names = _fleet(session)
    behind = names[8:16]
    settings = _settings()  # 10% of 24, at least 3: three nodes may be out
    job = rows.job(session, "llm-leaf-1")

    decide(session, job, _ib_errors(behind, NOW), NOW + timedelta(seconds=30), settings)

    (incident,) = session.scalars(select(SharedIncident)).all()
    assert (incident.component_kind, incident.component) == ("switch", "leaf-1")
    cordons = _cordons(session)
    assert sorted(cordons) == behind, "one cordon per member: decided for the component all the same"
    admitted = sorted(n for n, s in cordons.items() if s == "pending")
    held = sorted(n for n, s in cordons.items() if s == "awaiting_approval")
    assert admitted == behind[:3] and held == behind[3:]
    rails = {
        n: d.evidence["guard_rails"][breaker.RAIL]
        for n, d in session.execute(
            select(Node.name, Decision).join(Decision, Decision.node_id == Node.id).where(Decision.kind == "cordon")
        ).all()
    }
    assert all("within the limit of 3" in rails[n] for n in admitted)
    assert all(rails[n].startswith("held for a person: the fleet breaker tripped") for n in held)
    # Automation stopped at the limit: the held members stay in service until a person decides.
    states = _states(session, behind)
    assert [states[n] for n in admitted] == ["cordoned"] * 3
    assert {states[n] for n in held} == {"healthy"}
    # No per-node eviction for the shared cause, held or not.
    assert session.scalar(select(func.count()).where(Decision.kind == "evict")) == 0
    row = session.get_one(FleetBreaker, 1)
    assert (row.state, row.limit_nodes, row.fleet_nodes) == ("tripped", 3, 24)
    assert behind[3] in (row.tripped_reason or "")
    assert breaker.held_count(session) == 5

    (alert,) = _deliveries(session, "breaker_tripped")  # one breaker alert, not one per held cordon
    assert alert.payload["title"].startswith("Fleet breaker tripped")
    (announced,) = _deliveries(session, "shared_cause")
    assert f"Held for a person by the fleet breaker: {', '.join(held)}" in announced.payload["summary"]

    # Another pass with more evidence: nothing new, still one alert.
    decide(session, job, _ib_errors(behind, NOW + timedelta(seconds=40)), NOW + timedelta(seconds=60), settings)
    assert _cordons(session) == cordons
    assert len(_deliveries(session, "breaker_tripped")) == 1

    # A person lets one held cordon go; once the scheduler carried it out, the node is cordoned.
    decision_id = session.scalar(
        select(Decision.id).join(Node, Node.id == Decision.node_id).where(Node.name == held[0])
    )
    assert decision_id is not None
    later = NOW + timedelta(minutes=5)
    decisions.approve(session, decision_id=decision_id, actor="operator:alice", now=later, settings=settings)
    decisions.acknowledge(
        session, decision_id=decision_id, outcome="done", message="drained", actor="scheduler", now=later,
        settings=settings,
    )  # fmt: skip
    assert _states(session, [held[0]]) == {held[0]: "cordoned"}


def test_approval_mode_leaves_the_breaker_out_of_it(session: Session) -> None:
    names = _fleet(session)
    job = rows.job(session, "llm-approval")
    decide(session, job, _ib_errors(names[8:16], NOW), NOW + timedelta(seconds=30), _settings(policy_mode="approval"))
    assert set(_cordons(session).values()) == {"awaiting_approval"}
    assert breaker.tripped(session) is None, "a person decides every cordon already: nothing was taken out"


def test_a_racks_planned_maintenance_is_no_shared_cause(session: Session) -> None:
    """The eight nodes behind leaf-1 go down together for their announced maintenance: the errors they throw open no
    shared incident and cordon nothing for one (the window drained them already)."""
    names = _fleet(session)
    behind = names[8:16]
    settings = _settings(breaker_max_share=0.5)
    announced_at = NOW - timedelta(hours=1)
    for name in behind:
        window = WindowIn(starts_at=NOW - timedelta(minutes=5), ends_at=NOW + timedelta(hours=2), reason="PDU swap")
        planned.announce(session, name=name, window_in=window, actor="operator:ops", now=announced_at)
    prepared = planned.tick(session, settings=settings, now=NOW - timedelta(minutes=10))  # the beat, lead time ahead
    assert len(prepared.prepared) == 8
    job = rows.job(session, "llm-maintenance")

    decide(session, job, _ib_errors(behind, NOW), NOW + timedelta(seconds=30), settings)

    assert session.scalars(select(SharedIncident)).all() == []
    assert _cordons(session) == {}
    # What stands is the maintenance's own drain, one per node, and no accusation.
    kinds = session.execute(select(Decision.kind, Decision.incident_id, Decision.shared_incident_id)).all()
    assert sorted(kinds) == [("cordon", None, None)] * 8


def test_nodes_in_a_window_or_silenced_are_no_failing_members(session: Session) -> None:
    """Of leaf-1's eight nodes, two are inside an announced window (the beat has not drained them yet) and a person
    silenced one: the windows' two are the maintenance, no members; the silenced one is a member (a silence mutes
    faultline, it does not explain the finding) spared its cordon; the other five are cordoned."""
    names = _fleet(session)
    behind = names[8:16]
    settings = _settings(breaker_max_share=0.5)
    for name in behind[:2]:
        window = WindowIn(starts_at=NOW - timedelta(minutes=2), ends_at=NOW + timedelta(hours=1), reason="firmware")
        planned.announce(session, name=name, window_in=window, actor="operator:ops", now=NOW - timedelta(minutes=3))
    silence = Silence(
        node_pattern=behind[2], starts_at=NOW - timedelta(minutes=1), ends_at=NOW + timedelta(hours=1),
        author="ops", comment="reseating its HCA",
    )  # fmt: skip
    session.add(silence)
    session.flush()
    silence_id = silence.id
    job = rows.job(session, "llm-mixed")

    decide(session, job, _ib_errors(behind, NOW), NOW + timedelta(seconds=30), settings)

    (incident,) = session.scalars(select(SharedIncident)).all()
    assert sorted(m["node"] for m in incident.members) == behind[2:]
    assert sorted(_cordons(session)) == behind[3:]
    assert incident.evidence["spared"] == {behind[2]: f"silenced (silence {silence_id})"}
    # The silenced node: nothing decided, nothing held against it (the windows' nodes are judged by the per-node path
    # on their own until the beat drains and silences them, service/planned/).
    silenced = session.scalar(select(Node).where(Node.name == behind[2]))
    assert silenced is not None and silenced.state == "healthy"
    assert session.scalar(select(func.count()).where(Decision.node_id == silenced.id)) == 0


def test_a_member_in_maintenance_or_silenced_is_spared_its_cordon_until_that_is_over(session: Session) -> None:
    """Members that joined another way (an NVLink domain's trays) are spared while covered, and the incident says
    why; a later decision cordons them once the window is cancelled and the silence ends."""
    ids = [rows.node(session, f"tray-{i}").id for i in range(4)]
    window = planned.announce(
        session,
        name="tray-2",
        window_in=WindowIn(starts_at=NOW, ends_at=NOW + timedelta(hours=1), reason="tray swap"),
        actor="operator:ops",
        now=NOW,
    )
    silence = Silence(node_pattern="tray-3", starts_at=NOW, ends_at=NOW + timedelta(hours=1), author="ops", comment="x")
    session.add(silence)
    session.flush()
    incident = shared.open_or_update(
        session, component_kind="nvlink_domain", component="nvl-a", node_ids=ids, summary="NVLink domain nvl-a down",
        evidence={"categories": ["nvlink"]}, now=NOW + timedelta(seconds=10),
    )  # fmt: skip
    settings = _settings(breaker_enabled=False)

    made = shared.decide_for_component(session, incident=incident, now=NOW + timedelta(seconds=10), settings=settings)

    assert sorted(_cordons(session)) == ["tray-0", "tray-1"] and len(made) == 2
    assert incident.evidence["spared"] == {
        "tray-2": f"planned maintenance (window {window.id})",
        "tray-3": f"silenced (silence {silence.id})",
    }
    later = NOW + timedelta(minutes=5)
    planned.cancel(session, name="tray-2", window_id=window.id, actor="operator:ops", now=later)
    silences.expire(session, silence_id=silence.id, now=later)
    more = shared.decide_for_component(session, incident=incident, now=later + timedelta(seconds=1), settings=settings)
    assert len(more) == 2 and sorted(_cordons(session)) == [f"tray-{i}" for i in range(4)]
    assert incident.evidence["spared"] == {}


def test_maintenance_spans_run_from_the_drain_to_the_grace_and_stop_at_a_cancellation(session: Session) -> None:
    for name in ("span-a", "span-b", "span-c"):
        rows.node(session, name)
    settings = _settings(maintenance_grace_s=600.0, maintenance_lead_s=900.0)
    for name in ("span-a", "span-b", "span-c"):
        planned.announce(
            session, name=name, actor="ops", now=NOW,
            window_in=WindowIn(starts_at=NOW + timedelta(hours=1), ends_at=NOW + timedelta(hours=2), reason="x"),
        )  # fmt: skip
    windows = dict(
        session.execute(select(Node.name, MaintenanceWindow).join(Node, Node.id == MaintenanceWindow.node_id)).all()
    )
    windows["span-c"].cancelled_at = NOW + timedelta(minutes=30)  # cancelled before anything began
    session.flush()
    planned.tick(session, settings=settings, now=NOW + timedelta(minutes=50))  # drains span-a and span-b ahead
    windows["span-b"].cancelled_at = NOW + timedelta(minutes=70)  # cancelled ten minutes into it
    session.flush()

    def covered(node: str, minutes: float) -> bool:
        at = NOW + timedelta(minutes=minutes)
        return planned.covering(planned.maintenance_spans(session, since=at, until=at, settings=settings), node=node,
                                at=at) is not None  # fmt: skip

    # From the drain (the lead time before the start) to the end plus the grace.
    assert [covered("span-a", m) for m in (49, 50, 55, 120, 130, 131)] == [False, True, True, True, True, False]
    assert [covered("span-b", m) for m in (55, 65, 71)] == [True, True, False]
    assert not any(covered("span-c", m) for m in (55, 65, 90))
    assert not covered("span-d", 90)
