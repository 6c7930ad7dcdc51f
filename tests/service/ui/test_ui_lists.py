"""The incidents list and the silences page: filters, keyset pages, the silence form and its refusals."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Silence
from tests import rows
from tests.conftest import count


def _incident_ids(text: str) -> list[int]:
    """Incident ids in the list's first column, in page order."""
    return [int(i) for i in re.findall(r'<td class="num"><a href="/incidents/(\d+)">', text)]


def _next_link(text: str) -> str | None:
    match = re.search(r'<a href="([^"]*)" rel="next">', text)
    return html.unescape(match.group(1)) if match else None


def _seed_incidents(session: Session, n: int, *, job: Any = None) -> list[int]:
    """n incidents with four suspects each; of one job they are resolved (one open per job and root cause)."""
    ids = []
    for k in range(n):
        suspects = [f"gpu-node-{k:03d}-{s}" for s in range(4)]
        state = "resolved" if job else "open"
        ids.append(rows.incident(session, job=job or rows.job(session), suspects=suspects, state=state).id)
    return ids


# ---- /incidents ----


def test_incidents_list_shows_the_columns_newest_first(ui, session) -> None:
    job = rows.job(session, "llm-pretrain-42")
    older = rows.incident(
        session,
        job=job,
        suspects=["gpu-node-001", "gpu-node-002", "gpu-node-003", "gpu-node-004"],
        severity="critical",
        state="mitigating",
    )
    newer = rows.incident(
        session,
        job=rows.job(session, "llm-sft-7"),
        root_cause="user_code",
        blame="user_code",
        severity="major",
        summary="ZeroDivisionError on every rank",
        state="resolved",
        resolved_at=datetime.now(UTC),
        resolution="mitigated: rollback done",
    )
    page = ui.get("/incidents")
    assert page.status_code == 200
    assert _incident_ids(page.text)[:2] == [newer.id, older.id]
    text = page.text
    for expected in (
        "llm-pretrain-42",
        "llm-sft-7",
        "gpu hardware",
        "blame-infrastructure",
        "user code",
        "ZeroDivisionError on every rank",
        "mitigated: rollback done",
        "sev-critical",
        "istate-mitigating",
        "95%",
    ):
        assert expected in text, expected
    # The first three suspects, and how many more.
    assert "gpu-node-003" in text and "gpu-node-004" not in text and "+1 more" in text


def test_incident_filters(ui, session) -> None:
    a, b = rows.job(session, "job-a"), rows.job(session, "job-b")
    hw = rows.incident(session, job=a, severity="critical", state="open")
    hang = rows.incident(session, job=a, root_cause="hang", severity="critical", state="mitigating")
    slow = rows.incident(session, job=b, root_cause="straggler", severity="major", state="open")
    done = rows.incident(session, job=b, severity="minor", state="resolved", resolved_at=datetime.now(UTC))
    cases = {
        "state=unresolved": {hw.id, hang.id, slow.id},
        "state=resolved": {done.id},
        "state=mitigating": {hang.id},
        "severity=critical": {hw.id, hang.id},
        "job=job-b": {slow.id, done.id},
        "root_cause=hang": {hang.id},
        "job=job-a&severity=critical&state=open": {hw.id},
    }
    mine = {hw.id, hang.id, slow.id, done.id}
    for query, expected in cases.items():
        page = ui.get(f"/incidents?{query}")
        assert page.status_code == 200, query
        assert set(_incident_ids(page.text)) & mine == expected, query
    # The chosen filters stay selected in the form.
    assert "<option selected>critical</option>" in ui.get("/incidents?severity=critical").text


def test_incident_filters_refuse_unknown_values(ui) -> None:
    for query in ("state=bogus", "severity=huge", "root_cause=cosmic_rays", "cursor=nonsense"):
        page = ui.get(f"/incidents?{query}")
        assert page.status_code == 422, query
        assert "422" in page.text


def test_incident_pages_follow_the_next_link(ui, session) -> None:
    job = rows.job(session, "paged-job")
    ids = _seed_incidents(session, 5, job=job)
    seen: list[int] = []
    url: str | None = "/incidents?job=paged-job&limit=2"
    pages = 0
    while url:
        page = ui.get(url if url.startswith("/") else f"/incidents{url}")
        assert page.status_code == 200
        got = _incident_ids(page.text)
        assert len(got) <= 2
        seen += got
        url = _next_link(page.text)
        if url:
            assert "job=paged-job" in url and "limit=2" in url  # the filters travel with the cursor
        pages += 1
    assert pages == 3
    assert seen == sorted(ids, reverse=True)


def test_incident_list_query_count_does_not_grow_with_rows(ui, session, count_queries) -> None:
    _seed_incidents(session, 3)
    with count_queries() as few:
        assert ui.get("/incidents").status_code == 200
    _seed_incidents(session, 30)
    with count_queries() as many:
        page = ui.get("/incidents")
    assert page.status_code == 200 and len(_incident_ids(page.text)) == 33
    assert many.count == few.count


# ---- /silences ----


def _silence(session: Session, **values: Any) -> Silence:
    now = datetime.now(UTC)
    row = Silence(
        node_pattern=values.pop("node_pattern", "gpu-node-0?"),
        job_pattern=values.pop("job_pattern", None),
        starts_at=values.pop("starts_at", now - timedelta(minutes=5)),
        ends_at=values.pop("ends_at", now + timedelta(hours=1)),
        author=values.pop("author", "alice"),
        comment=values.pop("comment", "PSU swap"),
        **values,
    )
    session.add(row)
    session.flush()
    return row


def test_create_a_silence_through_the_form(ui, session) -> None:
    response = ui.post(
        "/silences",
        {"node_pattern": "gpu-node-01?", "job_pattern": "llm-*", "duration": "2", "unit": "hours", "comment": "PSU"},
    )
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/silences"
    row = session.scalars(select(Silence).where(Silence.node_pattern == "gpu-node-01?")).one()
    assert row.job_pattern == "llm-*" and row.comment == "PSU"
    assert row.author == "oncall-op"  # the viewer, not a field anyone can type
    assert row.ends_at - row.starts_at == timedelta(hours=2)
    assert abs(row.starts_at - datetime.now(UTC)) < timedelta(minutes=1)
    page = ui.get("/silences")
    assert f"Silence #{row.id} (active)" in page.text  # the flash
    assert "gpu-node-01?" in page.text and "sstate-active" in page.text


def test_a_silence_until_a_time_typed_in_utc(ui, session) -> None:
    until = (datetime.now(UTC) + timedelta(days=1)).replace(second=0, microsecond=0)
    response = ui.post("/silences", {"job_pattern": "llm-sft-*", "ends_at": until.strftime("%Y-%m-%dT%H:%M")})
    assert response.status_code == 303, response.text
    row = session.scalars(select(Silence).where(Silence.job_pattern == "llm-sft-*")).one()
    assert row.ends_at == until and row.node_pattern is None


def test_bad_silences_are_refused_with_the_reason_and_create_nothing(ui, session) -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    cases = [
        ({"duration": "2", "unit": "hours", "comment": "no matcher"}, "a silence must match something"),
        ({"node_pattern": "gpu node 1", "duration": "1", "unit": "hours"}, "may contain only letters"),
        ({"node_pattern": "gpu-*"}, "give exactly one of ends_at and duration_s"),
        ({"node_pattern": "gpu-*", "duration": "soon", "unit": "hours"}, "is not a number"),
        ({"node_pattern": "gpu-*", "duration": "-3", "unit": "hours"}, "greater than 0"),
        ({"node_pattern": "gpu-*", "ends_at": past}, "is in the past"),
        ({"node_pattern": "gpu-*", "ends_at": "tomorrow"}, "not a date and time"),
    ]
    before = count(session, "silences")
    for fields, message in cases:
        response = ui.post("/silences", fields)
        assert response.status_code == 422, fields
        assert message in html.unescape(response.text), fields
        assert 'class="form-error"' in response.text
        assert count(session, "silences") == before, fields
    # What was typed comes back in the form, to be fixed rather than typed again.
    response = ui.post("/silences", {"node_pattern": "gpu node 1", "comment": "rack 7 PSU", "duration": "1"})
    assert 'value="gpu node 1"' in response.text and 'value="rack 7 PSU"' in response.text


def test_expire_a_silence_and_filter_by_state(ui, session) -> None:
    now = datetime.now(UTC)
    active = _silence(session, node_pattern="active-*")
    pending = _silence(
        session, node_pattern="pending-*", starts_at=now + timedelta(hours=1), ends_at=now + timedelta(hours=2)
    )
    page = ui.get("/silences?state=active")
    assert "active-*" in page.text and "pending-*" not in page.text
    assert f'action="/silences/{active.id}/expire"' in page.text
    response = ui.post(f"/silences/{active.id}/expire", {"return_to": "/silences?state=active"})
    assert response.status_code == 303
    assert response.headers["location"] == "/silences?state=active"
    session.refresh(active)
    assert active.expired_at is not None
    assert "active-*" not in ui.get("/silences?state=active").text
    expired = ui.get("/silences?state=expired").text
    assert "active-*" in expired and f'action="/silences/{active.id}/expire"' not in expired  # no button once ended
    assert "pending-*" in ui.get("/silences?state=pending").text
    session.refresh(pending)
    assert pending.expired_at is None


def test_expiring_an_unknown_silence_is_a_404_page(ui) -> None:
    response = ui.post("/silences/999999/expire")
    assert response.status_code == 404
    assert "no silence 999999" in response.text


def test_silence_forms_need_the_csrf_token(ui, session) -> None:
    silence = _silence(session)
    before = count(session, "silences")
    created = ui.client.post("/silences", data={"node_pattern": "gpu-*", "duration": "1", "unit": "hours"})
    assert created.status_code == 403 and "CSRF" in created.text
    expired = ui.client.post(f"/silences/{silence.id}/expire", data={"csrf_token": "forged"})
    assert expired.status_code == 403
    assert count(session, "silences") == before
    session.refresh(silence)
    assert silence.expired_at is None


def test_silence_pages_and_query_count(ui, session, count_queries) -> None:
    for k in range(3):
        _silence(session, node_pattern=f"few-{k}-*")
    with count_queries() as few:
        assert ui.get("/silences").status_code == 200
    for k in range(60):
        _silence(session, node_pattern=f"many-{k}-*")
    with count_queries() as many:
        first = ui.get("/silences")
    assert many.count == few.count
    assert "many-59-*" in first.text and "few-0-*" not in first.text  # 50 a page, newest first
    link = _next_link(first.text)
    assert link is not None
    second = ui.get(link)
    assert "few-0-*" in second.text and "many-59-*" not in second.text


def test_the_api_filters_incidents_as_the_list_page_does(client, session, make_token) -> None:
    from tests.conftest import bearer

    job = rows.job(session)
    open_ = rows.incident(session, job=job, severity="critical", root_cause="network", state="open")
    rows.incident(session, job=job, severity="minor", root_cause="pcie", state="resolved")
    headers = bearer(make_token("scheduler"))
    got = client.get("/api/v1/incidents?state=unresolved&severity=critical&root_cause=network", headers=headers)
    assert got.status_code == 200
    assert [i["id"] for i in got.json()["items"]] == [open_.id]
    assert client.get("/api/v1/incidents?severity=huge", headers=headers).status_code == 422
