"""A person resolves an incident with a reason: the API (operator scope), the incident page's form, the trail."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Decision, Incident
from tests import rows
from tests.conftest import bearer


def test_an_operator_resolves_an_incident_with_a_reason_once(client, session: Session, make_token) -> None:
    _, _, incident, decision = rows.eviction(session)
    token = make_token("operator", name="oncall-ana")
    url = f"/api/v1/incidents/{incident.id}/resolve"

    response = client.post(url, json={"reason": "  link replaced by hand  "}, headers=bearer(token))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "resolved" and body["resolution"] == "by hand: link replaced by hand"
    assert body["resolved_by"] == "operator:oncall-ana" and body["resolved_at"] is not None
    session.refresh(decision)
    assert (decision.state, decision.actor) == ("rejected", "operator:oncall-ana"), "nobody should act on it any more"
    assert "link replaced by hand" in (decision.outcome_message or "")

    again = client.post(url, json={"reason": "twice"}, headers=bearer(token))
    assert again.status_code == 409 and "already resolved" in again.json()["message"]
    session.refresh(incident)
    assert incident.resolution == "by hand: link replaced by hand"


def test_bad_input_and_other_scopes_change_nothing(client, session: Session, make_token) -> None:
    _, _, incident, decision = rows.eviction(session)
    url = f"/api/v1/incidents/{incident.id}/resolve"
    operator = bearer(make_token("operator"))
    for body in ({}, {"reason": "   "}, {"reason": "x" * 401}, {"reason": "ok", "force": True}, {"reason": 7}):
        response = client.post(url, json=body, headers=operator)
        assert response.status_code == 422, (body, response.text)
    assert client.post(url, json={"reason": "ok"}, headers=bearer(make_token("scheduler"))).status_code == 403
    assert (
        client.post("/api/v1/incidents/999999999/resolve", json={"reason": "ok"}, headers=operator).status_code == 404
    )
    session.refresh(incident)
    session.refresh(decision)
    assert (incident.state, incident.resolved_by, decision.state) == ("mitigating", None, "pending")


def test_the_incident_page_resolves_with_a_reason_and_shows_who(ui, session: Session) -> None:
    _, _, incident, _ = rows.eviction(session)
    page = ui.get(f"/incidents/{incident.id}")
    assert f'action="/incidents/{incident.id}/resolve"' in page.text

    refused = ui.post(f"/incidents/{incident.id}/resolve", {"reason": ""})
    assert refused.status_code == 303
    assert session.scalar(select(Incident.state).where(Incident.id == incident.id)) == "mitigating"

    done = ui.post(f"/incidents/{incident.id}/resolve", {"reason": "false alarm: maintenance"})
    assert done.status_code == 303
    shown = ui.get(f"/incidents/{incident.id}")
    assert "by operator:oncall-op" in shown.text and "by hand: false alarm: maintenance" in shown.text
    assert f'action="/incidents/{incident.id}/resolve"' not in shown.text
    waiting = session.scalars(
        select(Decision).where(Decision.incident_id == incident.id, Decision.state == "pending")
    ).all()
    assert waiting == []
