"""The shared-cause contract: one open incident per component, cordons for its members, and what it explains."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Decision, Incident, Job, Node, NodeEvent, NotificationChannel, NotificationDelivery
from service.shared_causes import service as shared

NOW = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def _nodes(session: Session, names: list[str]) -> list[int]:
    rows = [Node(name=n, labels={"switch": "leaf-7"}) for n in names]
    session.add_all(rows)
    session.flush()
    return [r.id for r in rows]


def _open(session: Session, ids: list[int], **kw: object) -> object:
    return shared.open_or_update(
        session,
        component_kind=str(kw.get("kind", "switch")),
        component=str(kw.get("component", "leaf-7")),
        node_ids=ids,
        summary="IB errors on 3 nodes behind leaf-7",
        evidence={"categories": [str(kw.get("category", "network"))], "confidence": 0.9},
        now=kw.get("now", NOW),  # type: ignore[arg-type]
    )


def test_open_or_update_is_idempotent_and_adds_members(session: Session) -> None:
    ids = _nodes(session, ["sw-a", "sw-b", "sw-c", "sw-d"])
    first = _open(session, ids[:3])
    again = _open(session, ids[1:], category="storage", now=NOW + timedelta(seconds=30))
    assert again.id == first.id
    assert [m["node"] for m in again.members] == ["sw-a", "sw-b", "sw-c", "sw-d"]
    assert again.members[3]["joined_at"] == (NOW + timedelta(seconds=30)).isoformat()
    assert again.evidence["categories"] == ["network", "storage"]
    assert again.updated_at == NOW + timedelta(seconds=30)
    assert len(session.scalars(select(shared.SharedIncident)).all()) == 1
    # Another component opens its own.
    other = _open(session, ids[:3], kind="driver", component="550.54.15")
    assert other.id != first.id


def test_a_resolved_incident_lets_the_next_one_open(session: Session) -> None:
    ids = _nodes(session, ["r-a", "r-b", "r-c"])
    first = _open(session, ids)
    first.state, first.resolved_at = "resolved", NOW
    session.flush()
    second = _open(session, ids, now=NOW + timedelta(hours=1))
    assert second.id != first.id and second.state == "open"


def test_bad_component_kind_is_refused(session: Session) -> None:
    with pytest.raises(ValueError, match="unknown component kind"):
        shared.open_or_update(
            session, component_kind="moon", component="x", node_ids=[], summary="", evidence={}, now=NOW
        )


def test_decide_for_component_cordons_members_once_and_notifies_once(session: Session) -> None:
    session.add(NotificationChannel(name="ops", kind="json", url="https://chat.example.com/hook"))
    ids = _nodes(session, ["d-a", "d-b", "d-c"])
    incident = _open(session, ids)
    # A fleet of four, all cordoned: past the breaker's floor of 3 (its hold is tested in test_shared_safety.py).
    settings = Settings(breaker_enabled=False)
    made = shared.decide_for_component(session, incident=incident, now=NOW, settings=settings)
    assert sorted(d.node_id for d in made) == sorted(ids)
    assert {(d.kind, d.state, d.shared_incident_id, d.incident_id) for d in made} == {
        ("cordon", "pending", incident.id, None)
    }
    assert "shared cause switch leaf-7" in made[0].reason
    states = set(session.scalars(select(Node.state).where(Node.id.in_(ids))))
    assert states == {"cordoned"}
    events = session.scalars(select(NodeEvent).where(NodeEvent.node_id.in_(ids), NodeEvent.kind == "cordon")).all()
    assert len(events) == 3 and {e.source for e in events} == {"diagnosis"}
    # Again: nothing new; a new member gets its cordon; chat heard once.
    assert shared.decide_for_component(session, incident=incident, now=NOW, settings=settings) == []
    (late,) = _nodes(session, ["d-d"])
    incident = _open(session, [late], now=NOW + timedelta(seconds=20))
    more = shared.decide_for_component(session, incident=incident, now=NOW, settings=settings)
    assert [d.node_id for d in more] == [late]
    deliveries = session.scalars(select(NotificationDelivery)).all()
    assert len(deliveries) == 1
    assert deliveries[0].event == "shared_cause"
    assert deliveries[0].payload["url"].endswith(f"/shared-incidents/{incident.id}")
    assert "leaf-7" in deliveries[0].payload["title"]


def test_shadow_mode_records_and_moves_nothing(session: Session) -> None:
    ids = _nodes(session, ["s-a", "s-b", "s-c"])
    incident = _open(session, ids)
    made = shared.decide_for_component(session, incident=incident, now=NOW, settings=Settings(policy_mode="shadow"))
    assert {d.state for d in made} == {"shadow"}
    assert set(session.scalars(select(Node.state).where(Node.id.in_(ids)))) == {"healthy"}


def test_waiting_per_node_evictions_of_the_shared_category_are_superseded(session: Session) -> None:
    ids = _nodes(session, ["e-a", "e-b", "e-c"])
    job = Job(external_id="job-shared", world_size=8, source="registered")
    session.add(job)
    session.flush()
    network = Incident(job_id=job.id, root_cause="network", anchor="e-a")
    gpu = Incident(job_id=job.id, root_cause="gpu_hardware", anchor="e-b")
    session.add_all([network, gpu])
    session.flush()
    mine = Decision(
        incident_id=network.id, job_id=job.id, node_id=ids[0], kind="evict", state="pending", confidence=0.9,
        reason="evict e-a: IB errors", evidence={},
    )  # fmt: skip
    own = Decision(
        incident_id=gpu.id, job_id=job.id, node_id=ids[1], kind="evict", state="pending", confidence=0.95,
        reason="evict e-b: Xid 79", evidence={},
    )  # fmt: skip
    session.add_all([mine, own])
    session.flush()
    incident = _open(session, ids)
    shared.decide_for_component(session, incident=incident, now=NOW, settings=Settings())
    session.expire_all()
    assert session.get_one(Decision, mine.id).state == "rejected"
    assert "shared incident" in (session.get_one(Decision, mine.id).outcome_message or "")
    assert session.get_one(Decision, own.id).state == "pending"  # its own evidence: kept


def test_what_an_open_shared_incident_explains(session: Session) -> None:
    _nodes(session, ["x-a", "x-b", "x-c", "x-d"])
    ids = [session.scalar(select(Node.id).where(Node.name == n)) for n in ("x-a", "x-b", "x-c")]
    _open(session, ids)
    spans = shared.explained_members(session, now=NOW)

    def explained(node: str, category: str, at: datetime = NOW) -> bool:
        return shared.is_explained(spans, node=node, category=category, observed_at=at, evidence=None)

    assert explained("x-a", "network")
    # Another category (the node's own fatal Xid), a node outside it, a time long before it opened: not explained.
    assert not explained("x-a", "gpu_hardware")
    assert not explained("x-d", "network")
    assert not explained("x-a", "network", NOW - timedelta(hours=1))
    # Nothing opened after `now` counts (another clock's future).
    assert shared.explained_members(session, now=NOW - timedelta(seconds=1)) == []
