"""The decision lifecycle through the API: acknowledge, approve, reject, expire; and what it does to nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from service.decisions.lifecycle import expire_overdue
from service.models import Decision, Incident, Node, NodeEvent
from tests import rows
from tests.conftest import bearer


def _ack(client, token: str, decision_id: int, outcome: str = "done", message: str = "cordoned"):  # type: ignore[no-untyped-def]
    return client.post(
        f"/api/v1/decisions/{decision_id}/ack", json={"outcome": outcome, "message": message}, headers=bearer(token)
    )


def test_done_eviction_evicts_the_node_quarantines_it_and_resolves_the_incident(client, session, make_token) -> None:
    token = make_token("scheduler", name="k8s-adapter")
    _, node, incident, decision = rows.eviction(session)

    response = _ack(client, token, decision.id, message="cordoned and drained")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["outcome"], body["outcome_message"]) == ("done", "done", "cordoned and drained")
    assert body["actor"] == "scheduler:k8s-adapter" and body["acked_at"]

    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "evicted"
    assert node.quarantined_until is not None and node.quarantined_until > datetime.now(UTC) + timedelta(minutes=50)
    event = session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id)).one()
    assert (event.kind, event.from_state, event.to_state, event.decision_id) == (
        "evict_done",
        "healthy",
        "evicted",
        decision.id,
    )
    assert event.actor == "scheduler:k8s-adapter"
    incident = session.get_one(Incident, incident.id)
    assert incident.state == "resolved" and incident.resolution == f"mitigated: evict {node.name} done"


def test_acknowledging_twice_is_harmless_and_a_different_outcome_is_a_conflict(client, session, make_token) -> None:
    token = make_token("scheduler")
    *_, decision = rows.eviction(session)
    first = _ack(client, token, decision.id).json()
    again = _ack(client, token, decision.id)
    assert again.status_code == 200 and again.json() == first
    other = _ack(client, token, decision.id, outcome="failed")
    assert other.status_code == 409
    assert "already acknowledged as done" in other.json()["message"]
    session.expire_all()
    assert session.get_one(Decision, decision.id).state == "done"
    assert len(session.scalars(select(NodeEvent).where(NodeEvent.decision_id == decision.id)).all()) == 1


def test_unknown_expired_shadow_and_unapproved_decisions_are_refused_with_the_reason(
    client, session, make_token
) -> None:
    token = make_token("scheduler")
    assert _ack(client, token, 987654321).status_code == 404

    *_, late = rows.eviction(session, expires_in_s=-5)
    response = _ack(client, token, late.id)
    assert response.status_code == 409 and "expired" in response.json()["message"]

    *_, shadow = rows.eviction(session, state="shadow")
    response = _ack(client, token, shadow.id)
    assert response.status_code == 409 and "shadow" in response.json()["message"]

    *_, waiting = rows.eviction(session, state="awaiting_approval")
    response = _ack(client, token, waiting.id)
    assert response.status_code == 409 and "approval" in response.json()["message"]

    session.expire_all()
    assert [session.get_one(Decision, d.id).state for d in (late, shadow, waiting)] == [
        "pending",
        "shadow",
        "awaiting_approval",
    ]


def test_a_bad_outcome_is_422_and_changes_nothing(client, session, make_token) -> None:
    token = make_token("scheduler")
    *_, decision = rows.eviction(session)
    response = client.post(f"/api/v1/decisions/{decision.id}/ack", json={"outcome": "maybe"}, headers=bearer(token))
    assert response.status_code == 422
    session.expire_all()
    assert session.get_one(Decision, decision.id).state == "pending"


def test_failed_eviction_keeps_the_node_and_the_incident_open(client, session, make_token) -> None:
    token = make_token("scheduler")
    _, node, incident, decision = rows.eviction(session)
    assert _ack(client, token, decision.id, outcome="failed", message="node not found").status_code == 200
    session.expire_all()
    assert session.get_one(Node, node.id).state == "healthy"
    assert session.get_one(Incident, incident.id).state != "resolved"
    event = session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id)).one()
    assert (event.kind, event.reason) == ("evict_failed", "node not found")


def test_a_person_approves_or_rejects_what_waits_for_approval(client, session, make_token) -> None:
    operator, scheduler = make_token("operator", name="alice"), make_token("scheduler")
    *_, waiting = rows.eviction(session, state="awaiting_approval")
    assert client.post(f"/api/v1/decisions/{waiting.id}/approve", headers=bearer(scheduler)).status_code == 403
    response = client.post(f"/api/v1/decisions/{waiting.id}/approve", headers=bearer(operator))
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["actor"]) == ("pending", "operator:alice")
    assert _ack(client, scheduler, waiting.id).json()["state"] == "done"

    *_, other = rows.eviction(session, state="awaiting_approval")
    response = client.post(
        f"/api/v1/decisions/{other.id}/reject", json={"message": "known flaky link"}, headers=bearer(operator)
    )
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["outcome_message"]) == ("rejected", "known flaky link")
    assert _ack(client, scheduler, other.id).status_code == 409


def test_overdue_decisions_expire_and_say_so(client, session, make_token) -> None:
    *_, late = rows.eviction(session, expires_in_s=-1)
    *_, fresh = rows.eviction(session)
    *_, waiting = rows.eviction(session, state="awaiting_approval", expires_in_s=-1)
    expired = expire_overdue(session, now=datetime.now(UTC))
    assert set(expired) == {late.id, waiting.id}
    assert expire_overdue(session, now=datetime.now(UTC)) == []
    body = client.get(f"/api/v1/decisions/{late.id}", headers=bearer(make_token("scheduler"))).json()
    assert (body["state"], body["outcome_message"]) == ("expired", "not acknowledged before it expired")
    session.expire_all()
    assert session.get_one(Decision, fresh.id).state == "pending"


def test_long_poll_answers_at_once_when_something_matches(client, session, make_token) -> None:
    token = make_token("scheduler")
    *_, decision = rows.eviction(session)
    response = client.get("/api/v1/decisions?state=pending&kind=evict&wait=30", headers=bearer(token))
    assert [d["id"] for d in response.json()["items"]] == [decision.id]


def test_long_poll_gives_up_after_wait_with_an_empty_page(client, session, make_token) -> None:
    token = make_token("scheduler")
    response = client.get("/api/v1/decisions?state=pending&kind=evict&wait=1", headers=bearer(token))
    assert response.status_code == 200 and response.json() == {"items": [], "next_cursor": None}
    assert client.get("/api/v1/decisions?wait=61", headers=bearer(token)).status_code == 422


def test_after_keeps_only_newer_decisions(client, session, make_token) -> None:
    token = make_token("scheduler")
    *_, first = rows.eviction(session)
    *_, second = rows.eviction(session)
    page = client.get(f"/api/v1/decisions?after={first.id}", headers=bearer(token)).json()
    assert [d["id"] for d in page["items"]] == [second.id]
