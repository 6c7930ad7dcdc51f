"""GET /api/v1/jobs/{job_id}/ettr and the job page's step-based ETTR, against a hand computation from stored events."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from service.models import Job, LogEvent
from tests import rows
from tests.conftest import bearer, count

# Whole seconds, an hour back: the job began at T0.
T0 = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _step(seconds: float, step: int, rank: int = 0) -> dict:  # type: ignore[type-arg]
    line = f" iteration {step:8d}/  500000 | elapsed time per iteration (ms): 10000.0 |"
    return {"ts": _t(seconds).isoformat(), "source": "training", "kind": "step", "line": line, "rank": rank,
            "severity": "debug", "fields": {"step": step, "total": 500000}}  # fmt: skip


# Steps 1-10 every 10 s; a checkpoint of step 5 at 52 s (an explicit event); the job fails at 105 s, restarts from
# the checkpoint and logs step 6 at 200 s, back at 10 at 240 s, 11 at 250 s, then a 60 s pause (> 5 x the 10 s
# median), 12 at 310 s and 13 at 320 s. Rank 1 logs a few steps too (fewer lines: not the stream followed).
LOGS = (
    [_step(10 * k, k) for k in range(1, 11)]
    + [_step(200 + 10 * i, 6 + i) for i in range(6)]
    + [_step(310, 12), _step(320, 13)]
    + [_step(10 * k + 3, k, rank=1) for k in (1, 2, 3)]
    + [
        {
            "ts": _t(52).isoformat(),
            "source": "trainer",
            "kind": "checkpoint_saved",
            "line": "saved /ckpt/step-5",
            "fields": {"step": 5},
        },
        {"ts": _t(60).isoformat(), "source": "trainer", "kind": "checkpoint_saved", "line": "saving, no step yet"},
    ]
)
END = 330


def _batch(logs: list[dict]) -> dict:  # type: ignore[type-arg]
    return {"batch_id": str(uuid.uuid4()), "node": "ettr-node-1", "sent_at": datetime.now(UTC).isoformat(),
            "job_id": "ettr-42", "logs": logs}  # fmt: skip


@pytest.fixture
def stored(client, session, make_token) -> Job:  # type: ignore[no-untyped-def]
    response = client.post("/api/v1/ingest", json=_batch(LOGS), headers=bearer(make_token("agent")))
    assert response.status_code == 200, response.text
    job = session.scalar(select(Job).where(Job.external_id == "ettr-42"))
    assert job is not None
    # The job began at T0 and ended with its last report at 330 s.
    session.execute(update(Job).where(Job.id == job.id).values(created_at=T0, state="finished", last_seen_at=_t(END)))
    rows.incident(session, job=job, opened_at=_t(105), resolved_at=_t(260), state="resolved")
    rows.incident(
        session,
        job=job,
        state="resolved",
        opened_at=_t(106),
        resolved_at=_t(150),
        resolution="merged: its findings belong to another incident",
    )
    session.flush()
    session.expire_all()
    return job


@pytest.fixture
def scheduler(make_token) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return bearer(make_token("scheduler"))


def test_the_endpoint_agrees_with_a_hand_computation(client, stored, scheduler) -> None:  # type: ignore[no-untyped-def]
    body = client.get("/api/v1/jobs/ettr-42/ettr?window=2m", headers=scheduler).json()
    # Productive: 10->100 s (steps 2-10) 90 s; 240->250 s (step 11) 10 s; 250->310 s a pause, step 12 counts its
    # median 10 s; 310->320 s 10 s: 120 s of 330 s. Not: before the first step, the outage, redone steps 7-10.
    total = body["cumulative"]
    assert (total["productive_s"], total["wall_s"]) == (pytest.approx(120), 330)
    assert total["ratio"] == pytest.approx(120 / 330)
    assert total["start"].startswith(T0.isoformat()[:19])
    # The last 2 minutes, [210, 330]: 240->250 10 s, the pause's 10 s, 310->320 10 s.
    assert body["window"] == "2m" and body["window_s"] == 120
    assert body["sliding"]["productive_s"] == pytest.approx(30) and body["sliding"]["ratio"] == pytest.approx(0.25)
    assert body["median_step_s"] == 10 and body["highest_step"] == 13 and body["steps_seen"] == 18
    assert body["checkpoints"] == 1 and body["last_checkpoint_step"] == 5
    (restart,) = body["restarts"]
    assert (restart["from_step"], restart["to_step"], restart["checkpoint_step"]) == (10, 6, 5)
    # One incident: the merged one does not count. Lost from step 10 (100 s) to step 11 (250 s): 100 s down (to step
    # 6 at 200 s), 50 s redoing steps 6-10 from the checkpoint of step 5.
    (loss,) = body["incidents"]
    assert (loss["lost_s"], loss["down_s"], loss["redone_s"]) == (150, 100, 50)
    assert (loss["step_reached"], loss["resumed_step"], loss["checkpoint_step"], loss["steps_redone"]) == (10, 6, 5, 5)
    assert loss["last_productive_at"].startswith(_t(100).isoformat()[:19])
    assert loss["productive_again_at"].startswith(_t(250).isoformat()[:19]) and not loss["ongoing"]
    assert len(body["series"]) == 119 and body["series"][-1]["cumulative"] == pytest.approx(120 / 330)
    # The same lost time cut into stalls, each charged once: the parts add up to 330 - 120 = 210 s.
    lost = body["lost"]
    assert lost["total_s"] == pytest.approx(210) and lost["by_incident"] == {str(loss["incident_id"]): 140.0}
    assert (lost["startup_s"], lost["unexplained_s"], lost["pending_s"]) == (10, 50, 10)
    assert [(st["lost_s"], st["incident_id"]) for st in body["stalls"]] == [
        (10, None),
        (140, loss["incident_id"]),
        (50, None),
    ]


def test_the_gauges_follow_the_last_computation(client, stored, scheduler) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/api/v1/jobs/ettr-42/ettr", headers=scheduler).status_code == 200
    metrics = client.get("/metrics").text
    values = dict(re.findall(r'faultline_job_ettr_ratio\{job="ettr-42",span="(\w+)"\} ([\d.e-]+)', metrics))
    # The job lasted less than an hour: its last hour is its whole life.
    assert float(values["total"]) == pytest.approx(120 / 330) and float(values["1h"]) == pytest.approx(120 / 330)


@pytest.mark.parametrize("window", ["abc", "0m", "31d", "1w", "-1h", "99999999h"])
def test_a_bad_window_is_422(client, stored, scheduler, window) -> None:  # type: ignore[no-untyped-def]
    response = client.get(f"/api/v1/jobs/ettr-42/ettr?window={window}", headers=scheduler)
    assert response.status_code == 422, response.text
    assert "window" in response.json()["message"]


def test_unknown_job_is_404_and_agents_may_not_read(client, stored, make_token) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/api/v1/jobs/nope/ettr", headers=bearer(make_token("scheduler"))).status_code == 404
    assert client.get("/api/v1/jobs/ettr-42/ettr", headers=bearer(make_token("agent"))).status_code == 403


def test_a_job_without_step_lines_has_no_ratio(client, session, scheduler) -> None:  # type: ignore[no-untyped-def]
    rows.job(session, "quiet-job")
    body = client.get("/api/v1/jobs/quiet-job/ettr", headers=scheduler).json()
    assert body["cumulative"]["ratio"] is None and body["steps_seen"] == 0 and body["incidents"] == []


@pytest.mark.parametrize("step", ["2000", -1, 1.5, True, None])
def test_an_explicit_checkpoint_event_with_a_bad_step_is_422_and_stores_nothing(
    client, session, make_token, step
) -> None:  # type: ignore[no-untyped-def]
    event = {
        "ts": _t(5).isoformat(),
        "source": "trainer",
        "kind": "checkpoint_saved",
        "line": "x",
        "fields": {"step": step},
    }
    response = client.post("/api/v1/ingest", json=_batch([_step(1, 1), event]), headers=bearer(make_token("agent")))
    assert response.status_code == 422, response.text
    assert "checkpoint_saved" in response.text
    assert count(session, "log_events") == 0 and session.scalar(select(LogEvent.id).limit(1)) is None


def test_the_job_page_shows_the_ettr_plot_and_the_time_lost_per_incident(ui, stored) -> None:  # type: ignore[no-untyped-def]
    page = ui.get("/jobs/ettr-42")
    assert page.status_code == 200
    card = page.text.split('id="job-progress"', 1)[1].split("</section>", 1)[0]
    # One ETTR on the page, from step progress: 120 of 330 s productive, since the start and over the last hour
    # (the job's whole life); the incidents' open time is context, not a second ratio.
    ettr_card = page.text.split('id="job-ettr"', 1)[1].split("</section>", 1)[0]
    assert re.findall(r'<b class="ettr [^"]+">([\d.]+%)</b>', ettr_card) == ["36.4%", "36.4%"]
    assert re.findall(r'<b class="ettr', page.text.split('id="job-ettr"', 1)[1]) == re.findall(
        r'<b class="ettr', ettr_card
    )
    assert "step 13" in card and "1 restart " in card and "last checkpoint 5" in card
    assert '<svg class="plot"' in card and re.search(r'class="suspect ettr-total" d="M[\d.,L]+"', card)
    # The stalls, each once: the start-up (10 s), the outage and the redone steps 6-10 (100 s down to step 6 at
    # 200 s, 40 s redoing to step 10 at 240 s), charged to the incident that opened in it; the 60 s pause before
    # step 12 (50 s beyond the median step) charged to nobody: the incident was open when it began, not its cause.
    body = card.split('class="stalls"', 1)[1].split("</table>", 1)[0]
    rows_ = re.findall(r"<tr(?: data-incident=\"(\d+)\")?>(.*?)</tr>", body.split("<tbody>", 1)[1], flags=re.S)
    cells = [
        [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
        for _, r in rows_
    ]
    assert [r[1] for r in cells] == ["10 s", "2.3 min", "50 s"]
    assert [bool(i) for i, _ in rows_] == [False, True, False] and "start-up" in cells[0][0]
    assert cells[1][3:] == ["10", "6", "5", "1", "5", "1.7 min", "40 s"]
    assert "no incident" in cells[2][2] and f"#{rows_[1][0]}" in cells[2][2]  # also open, not charged
    # The cost table: that incident, charged once, and a total that is the ETTR's: 330 s x (1 - 36.4%) = 210 s.
    costly = page.text.split('id="job-incidents"', 1)[1].split("</section>", 1)[0]
    (incident_row,) = re.findall(r'<tr data-incident="(\d+)">(.*?)</tr>', costly, flags=re.S)
    assert incident_row[0] == rows_[1][0] and "2.3 min" in incident_row[1]
    totals = dict(re.findall(r'id="(cost-\w+)">([^<]+)<', costly))
    assert totals == {"cost-charged": "2.3 min", "cost-free": "70 s", "cost-total": "3.5 min"}
    assert "ETTR 36.4%" in costly and "wall time 5.5 min" in costly


def test_gauges_keep_at_most_max_gauge_jobs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ml.ettr import StepRecord, compute
    from service.jobs import ettr as service_ettr
    from service.observability import JOB_ETTR

    monkeypatch.setattr(service_ettr, "MAX_GAUGE_JOBS", 3)
    report = compute([StepRecord(_t(0), 0), StepRecord(_t(10), 1)], start=_t(0), end=_t(20))
    for i in range(5):
        service_ettr.publish(f"gauge-job-{i}", report)
    jobs = {s.labels["job"] for metric in JOB_ETTR.collect() for s in metric.samples}
    assert {j for j in jobs if j.startswith("gauge-job-")} == {"gauge-job-2", "gauge-job-3", "gauge-job-4"}
    assert JOB_ETTR.labels(job="gauge-job-4", span="total")._value.get() == pytest.approx(0.5)


def test_a_job_whose_step_lines_were_cut_is_measured_from_the_first_one_read(monkeypatch, session) -> None:  # type: ignore[no-untyped-def]
    from ml.ettr import StepRecord
    from service.jobs import ettr as service_ettr

    job = rows.job(session, "long-job")
    began = job.created_at
    steps = [StepRecord(began + timedelta(seconds=100), 1), StepRecord(began + timedelta(seconds=110), 2)]
    now = began + timedelta(seconds=200)
    assert service_ettr.measurement_span(job, steps, now=now) == (began, now)
    monkeypatch.setattr(service_ettr, "MAX_STEPS", 2)
    assert service_ettr.measurement_span(job, steps, now=now) == (steps[0].ts, now)
