"""An on-call says "I'm on it" (issue 40): who and when, through the API (operator scope) and the incident page's
button, kept in the incident's record and timeline; the incident's state and decisions stay as they were."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Decision, Incident
from tests import rows
from tests.conftest import bearer


def test_an_operator_acknowledges_without_changing_state_or_decisions(client, session: Session, make_token) -> None:
    _, _, incident, decision = rows.eviction(session)
    ana = bearer(make_token("operator", name="oncall-ana"))
    url = f"/api/v1/incidents/{incident.id}/acknowledge"

    response = client.post(url, json={"note": "  looking at the node's GPU 3  "}, headers=ana)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["acknowledged_by"] == "operator:oncall-ana" and body["acknowledged_at"] is not None
    assert [(a["actor"], a["note"]) for a in body["acknowledgements"]] == [
        ("operator:oncall-ana", "looking at the node's GPU 3")
    ]
    assert body["state"] == "mitigating" and [d["state"] for d in body["decisions"]] == ["pending"]
    session.refresh(decision)
    assert (decision.state, decision.actor) == ("pending", None)

    # The same person again: nothing changes, the first time stays.
    again = client.post(url, headers=ana)
    assert again.status_code == 200 and again.json()["acknowledged_at"] == body["acknowledged_at"]
    assert len(again.json()["acknowledgements"]) == 1

    # Someone else takes it over; both stay in the record, and lists show the latest.
    ben = client.post(url, json={}, headers=bearer(make_token("admin", name="oncall-ben"))).json()
    assert ben["acknowledged_by"] == "admin:oncall-ben"
    assert [a["actor"] for a in ben["acknowledgements"]] == ["operator:oncall-ana", "admin:oncall-ben"]
    listed = client.get(f"/api/v1/incidents?job={ben['job_id']}", headers=ana).json()["items"]
    assert [(i["id"], i["acknowledged_by"]) for i in listed] == [(incident.id, "admin:oncall-ben")]


def test_bad_input_other_scopes_unknown_and_resolved_incidents_change_nothing(
    client, session: Session, make_token
) -> None:
    _, _, incident, _ = rows.eviction(session)
    url = f"/api/v1/incidents/{incident.id}/acknowledge"
    operator = bearer(make_token("operator"))
    for body in ({"note": "x" * 401}, {"note": 7}, {"who": "me"}):
        assert client.post(url, json=body, headers=operator).status_code == 422, body
    assert client.post(url, headers=bearer(make_token("scheduler"))).status_code == 403
    assert client.post("/api/v1/incidents/999999999/acknowledge", headers=operator).status_code == 404
    session.refresh(incident)
    assert (incident.acknowledged_by, incident.acknowledgements) == (None, [])

    closed = rows.incident(session, job=rows.job(session), state="resolved", resolution="quiet")
    refused = client.post(f"/api/v1/incidents/{closed.id}/acknowledge", headers=operator)
    assert refused.status_code == 409 and "nothing left to be on" in refused.json()["message"]


def test_the_incident_page_button_and_the_list_show_who_is_on_it(ui, session: Session) -> None:
    _, _, incident, _ = rows.eviction(session)
    page = ui.get(f"/incidents/{incident.id}")
    assert f'action="/incidents/{incident.id}/acknowledge"' in page.text and "Nobody has said" in page.text

    done = ui.post(f"/incidents/{incident.id}/acknowledge", {"note": "on the phone with the DC"})
    assert done.status_code == 303
    shown = ui.get(f"/incidents/{incident.id}")
    assert "<b>operator:oncall-op</b> is on it" in shown.text and "on the phone with the DC" in shown.text
    assert f'action="/incidents/{incident.id}/acknowledge"' not in shown.text, "no button for who is on it already"
    assert "acknowledged by operator:oncall-op" in shown.text, "the timeline records it"
    assert session.scalar(select(Incident.state).where(Incident.id == incident.id)) == "mitigating"
    assert session.scalar(select(Decision.state).where(Decision.incident_id == incident.id)) == "pending"

    listed = ui.get("/incidents")
    assert 'class="pill ack"' in listed.text and "operator:oncall-op" in listed.text
