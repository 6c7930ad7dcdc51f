"""Jobs not getting anywhere (service/jobs/progress.py): the progress mark beat keeps, the stalled list on a set
clock, why each is stalled, and GET /api/v1/stalled-jobs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from service.jobs import progress
from service.models import DetectorState, Job, LogEvent, Node
from tests import rows
from tests.conftest import bearer

# Whole seconds, two hours back, so the agents' times are in the past of the real clock too.
T0 = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)
TEN_MIN = 600.0


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _log(session, job: Job, node: Node, at: float, step: int, *, rank: int = 0, kind: str = "step") -> None:  # type: ignore[no-untyped-def]
    session.add(
        LogEvent(
            batch_id=uuid.uuid4(), node_id=node.id, job_id=job.id, ts=_t(at), source="training", kind=kind,
            line=f"iteration {step}", rank=rank, fields={"step": step},
        )
    )  # fmt: skip


def _steps(session, job: Job, node: Node, first: int, last: int, *, at: float, every: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    for i, step in enumerate(range(first, last + 1)):
        for rank in (0, 1):  # every rank logs the same steps, a little apart
            _log(session, job, node, at + every * i + rank * 0.3, step, rank=rank)
    session.flush()


@pytest.fixture
def job(session) -> tuple[Job, Node]:  # type: ignore[no-untyped-def]
    j = rows.job(session, "stall-42")
    j.created_at = j.updated_at = T0  # registered when it began, before its step lines
    n = rows.node(session, "stall-node-1")
    session.flush()
    return j, n


def _stalled(session, at: float, after_s: float = TEN_MIN) -> list[progress.StalledJob]:  # type: ignore[no-untyped-def]
    return [s for s in progress.stalled(session, now=_t(at), after_s=after_s) if s.job_id == "stall-42"]


def test_a_job_is_listed_as_soon_as_it_crosses_the_threshold_and_not_before(session, job) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 60, at=0)  # step 60 first logged at 590 s
    assert progress.track(session, now=_t(600)) >= 1
    assert _stalled(session, 590 + TEN_MIN - 1) == []
    # One second past the threshold it is listed, with when it last made progress: the list compares the mark with
    # the clock when read, so a job appears on the first read past its threshold (the overview reads every 5 s).
    (s,) = _stalled(session, 590 + TEN_MIN + 1)
    assert (s.step, s.since, s.stalled_s) == (60, _t(590), TEN_MIN + 1)
    assert s.reason.kind == "down" and s.reason.text.startswith("silent: no step since")  # no process snapshots
    # The beat's pass again, later, over the same lines (its overlap): the mark does not move.
    progress.track(session, now=_t(1300))
    (again,) = _stalled(session, 1300)
    assert (again.step, again.since) == (60, _t(590))


def test_restarting_from_the_same_checkpoint_again_and_again_stays_listed_until_it_gets_past(session, job) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 60, at=0)
    _log(session, j, n, 300, 40, kind="checkpoint_saved")
    progress.track(session, now=_t(600))
    # Two restarts from the checkpoint of step 40, each dying before step 60.
    _steps(session, j, n, 41, 55, at=700)
    _steps(session, j, n, 41, 58, at=1000)
    progress.track(session, now=_t(1200))
    (s,) = _stalled(session, 1200)
    assert s.reason.kind == "restart_loop" and s.reason.restarts == 2 and s.reason.restart_steps == (41, 41)
    assert "each back to step 41, never past step 60" in s.reason.text and s.reason.checkpoint_step == 40
    # A third run gets past 60: the mark moves and the job is off the list.
    _steps(session, j, n, 41, 70, at=1300)
    progress.track(session, now=_t(1600))
    assert _stalled(session, 1600) == []
    mark = progress.Mark.from_json(
        session.scalar(
            select(DetectorState.state).where(DetectorState.job_id == j.id, DetectorState.detector == "progress_mark")
        )
    )
    assert (mark.high, mark.high_at, mark.high_rank) == (70, _t(1590), 0)


def test_waiting_for_a_spare_names_the_eviction_and_what_the_scheduler_said(session, job) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 60, at=0)
    progress.track(session, now=_t(600))
    incident = rows.incident(session, job=j, suspects=[n.name], opened_at=_t(595))
    decision = rows.decision(session, incident=incident, node=n, state="done")
    decision.created_at, decision.acked_at = _t(600), _t(610)
    decision.outcome_message = "stall-node-1 out of the job (repair); node rank 0: waiting for a spare"
    session.flush()
    (s,) = _stalled(session, 1300)
    assert s.reason.kind == "waiting_for_spare" and s.reason.action_id == decision.id
    assert "stall-node-1 evicted" in s.reason.text and "waiting for a spare" in s.reason.details[0]
    assert [i.id for i in s.incidents] == [incident.id]


def test_a_job_that_logs_rarely_is_held_to_three_times_its_pace(session, job) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 4, at=0, every=900)  # a step line every 15 minutes, the last at 2700 s
    progress.track(session, now=_t(2710))
    assert _stalled(session, 2700 + 11 * 60) == []  # past 10 min, not past 3 x 15 min
    (s,) = _stalled(session, 2700 + 46 * 60)
    assert s.threshold_s == pytest.approx(2700)


def test_the_api_lists_stalled_jobs_and_refuses_a_bad_threshold_naming_it(client, session, job, make_token) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 60, at=0)
    progress.track(session, now=datetime.now(UTC))
    headers = bearer(make_token("scheduler"))
    body = client.get("/api/v1/stalled-jobs", headers=headers).json()
    assert body["after_s"] == 600
    (item,) = [i for i in body["items"] if i["job_id"] == "stall-42"]
    assert item["step_reached"] == 60 and item["since"].startswith(_t(590).isoformat()[:19])
    assert item["reason"] == "down" and item["stalled_s"] > 6000
    assert client.get("/api/v1/stalled-jobs?after_s=86400", headers=headers).json()["items"] == []
    bad = client.get("/api/v1/stalled-jobs?after_s=-5", headers=headers)
    assert bad.status_code == 422 and "after_s" in bad.text
    assert client.get("/api/v1/stalled-jobs").status_code == 401


def test_the_overview_lists_the_stalled_job_with_why(ui, session, job) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 60, at=0)
    progress.track(session, now=datetime.now(UTC))
    section = ui.get("/").text.split('id="stalled-jobs"', 1)[1].split("</section>", 1)[0]
    assert 'data-job="stall-42"' in section and 'data-reason="down"' in section
    assert "no net progress for" in section and "highest step 60" in section


def test_an_ended_job_s_mark_goes_and_a_new_run_of_the_same_id_starts_over(session, job) -> None:  # type: ignore[no-untyped-def]
    j, n = job
    _steps(session, j, n, 1, 60, at=0)
    progress.track(session, now=_t(600))
    j.state = "finished"
    session.flush()
    progress.track(session, now=_t(700))
    assert session.scalar(select(DetectorState.job_id).where(DetectorState.job_id == j.id)) is None
    # Registered again at 800 s, it trains from step 1: its new steps are progress, not a stall below step 60.
    j.state, j.updated_at = "running", _t(800)
    _steps(session, j, n, 1, 20, at=810)
    progress.track(session, now=_t(1010))
    assert _stalled(session, 1010) == []
    (s,) = _stalled(session, 1000 + TEN_MIN + 1)
    assert (s.step, s.since) == (20, _t(1000))
