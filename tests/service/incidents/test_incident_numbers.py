"""Incident numbers as the on-call sees them (issue 40): a diagnosis pass that finds its incident already open draws
no number, so the numbers of a job's incidents follow one another; a number with no incident explains itself."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from service.incidents import service as incidents
from tests import rows
from tests.conftest import bearer


def test_passes_that_find_the_incident_open_draw_no_number(session: Session) -> None:
    job = rows.job(session)
    first, created = incidents.open_incident(session, job=job, root_cause="gpu_hardware", anchor="node-a")
    assert created
    # A diagnosis pass a second asks for the open incident again: 50 passes used to leave 50 numbers unused.
    for _ in range(50):
        again, created = incidents.open_incident(session, job=job, root_cause="gpu_hardware", anchor="node-a")
        assert again.id == first.id and not created
    incidents.resolve(session, incident=first, resolution="quiet", now=datetime.now(UTC))
    second, created = incidents.open_incident(session, job=job, root_cause="gpu_hardware", anchor="node-a")
    other, _ = incidents.open_incident(session, job=job, root_cause="nvlink", anchor="node-b")
    assert created and [second.id, other.id] == [first.id + 1, first.id + 2]


def test_a_number_without_an_incident_says_why_and_links_its_neighbours(ui, session: Session) -> None:
    job = rows.job(session)
    before = rows.incident(session, job=job)
    rows.incident(session, job=job, id=before.id + 5, root_cause="nvlink")  # numbers skipped in between
    page = ui.get(f"/incidents/{before.id + 2}")
    assert page.status_code == 404
    assert f"There is no incident #{before.id + 2}: nothing happened under this number" in page.text
    assert f'href="/incidents/{before.id}"' in page.text and f'href="/incidents/{before.id + 5}"' in page.text
    later = ui.get(f"/incidents/{before.id + 100}")
    assert later.status_code == 404 and f"the latest is #{before.id + 5}" in later.text


def test_the_api_keeps_its_ids_and_answers_an_unknown_one_404(client, session: Session, make_token) -> None:
    job = rows.job(session)
    incident = rows.incident(session, job=job)
    token = bearer(make_token("scheduler"))
    assert client.get(f"/api/v1/incidents/{incident.id}", headers=token).json()["id"] == incident.id
    assert client.get(f"/api/v1/incidents/{incident.id + 1}", headers=token).status_code == 404
