"""A person overrides a decision: another action for the same incident replaces it, through the API or the UI."""

from __future__ import annotations

from sqlalchemy import select

from service.models import Decision
from tests import rows
from tests.conftest import bearer, count


def test_an_operator_replaces_an_eviction_with_one_of_another_node(client, session, make_token) -> None:
    _job, _node, incident, decision = rows.eviction(session)
    other = rows.node(session)
    response = client.post(
        f"/api/v1/decisions/{decision.id}/override",
        json={"kind": "evict", "node": other.name, "message": "the ECC errors are on the other node"},
        headers=bearer(make_token("operator", name="dana")),
    )
    assert response.status_code == 201, response.text
    new = response.json()
    assert (new["kind"], new["node"], new["state"], new["actor"]) == ("evict", other.name, "pending", "operator:dana")
    assert new["incident_id"] == incident.id and f"instead of decision {decision.id}" in new["reason"]
    assert new["evidence"]["overrides"] == decision.id
    session.refresh(decision)
    assert decision.state == "rejected"
    assert decision.outcome_message.startswith(f"overridden by decision {new['id']} (evict {other.name})")


def test_an_override_to_a_job_action_needs_no_node_and_refuses_one(client, session, make_token) -> None:
    _, node, _, decision = rows.eviction(session)
    headers = bearer(make_token("operator"))
    bad = client.post(
        f"/api/v1/decisions/{decision.id}/override",
        json={"kind": "restart", "node": node.name, "message": "x"},
        headers=headers,
    )
    assert bad.status_code == 422 and "acts on the job" in bad.text
    missing = client.post(
        f"/api/v1/decisions/{decision.id}/override", json={"kind": "cordon", "message": "x"}, headers=headers
    )
    assert missing.status_code == 422 and "needs a node" in missing.text
    unknown = client.post(
        f"/api/v1/decisions/{decision.id}/override",
        json={"kind": "evict", "node": "no-such-node", "message": "x"},
        headers=headers,
    )
    assert unknown.status_code == 404
    assert count(session, "decisions") == 1
    restart = client.post(
        f"/api/v1/decisions/{decision.id}/override",
        json={"kind": "restart", "message": "a restart clears it; keep the node"},
        headers=headers,
    )
    assert restart.status_code == 201 and restart.json()["node"] is None


def test_a_closed_or_identical_override_is_a_conflict_and_changes_nothing(client, session, make_token) -> None:
    _, node, _, decision = rows.eviction(session, state="done")
    headers = bearer(make_token("operator"))
    closed = client.post(
        f"/api/v1/decisions/{decision.id}/override",
        json={"kind": "diagnose", "node": node.name, "message": "x"},
        headers=headers,
    )
    assert closed.status_code == 409 and "already acknowledged" in closed.text
    _, node2, _, pending = rows.eviction(session)
    same = client.post(
        f"/api/v1/decisions/{pending.id}/override",
        json={"kind": "evict", "node": node2.name, "message": "x"},
        headers=headers,
    )
    assert same.status_code == 409 and "approve it instead" in same.text
    assert count(session, "decisions") == 2


def test_the_ui_override_form_replaces_the_decision(ui, session) -> None:
    _, node, incident, decision = rows.eviction(session)
    other = rows.node(session)
    response = ui.post(
        f"/decisions/{decision.id}/override",
        {"kind": "diagnose", "node": other.name, "message": "run diagnostics first", "return_to": "/"},
        htmx=True,
    )
    assert response.status_code == 200, response.text
    assert "diagnose" in response.text and other.name in response.text
    session.expire_all()
    rows_ = session.scalars(select(Decision).where(Decision.incident_id == incident.id).order_by(Decision.id)).all()
    assert [(d.kind, d.state, d.actor) for d in rows_] == [
        ("evict", "rejected", "operator:oncall-op"),
        ("diagnose", "pending", "operator:oncall-op"),
    ]
    # A refused override (no reason given) says why and leaves things as they are.
    again = ui.post(
        f"/decisions/{rows_[1].id}/override", {"kind": "evict", "node": node.name, "message": " "}, htmx=True
    )
    assert again.status_code == 422
    assert count(session, "decisions") == 2
