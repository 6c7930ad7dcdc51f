"""A job's ETTR from its stored step lines, checkpoint saves and incidents (ml/ettr.py), and its Prometheus gauges."""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ml import ettr
from service.errors import InvalidInput
from service.jobs.schemas import (
    EttrOut,
    EttrPointOut,
    EttrSpanOut,
    IncidentLossOut,
    LostOut,
    RestartOut,
    StallOut,
)
from service.models import Incident, Job, LogEvent
from service.models.planned import not_planned
from service.observability import JOB_ETTR

# Step lines of one stream read back, the newest: a day of a step a second fits.
MAX_STEPS = 100_000
STREAM_SAMPLE = 10_000  # newest step lines of the job that choose its stream
MAX_CHECKPOINTS = 10_000
MIN_WINDOW = timedelta(minutes=1)
MAX_WINDOW = timedelta(days=30)
_WINDOW = re.compile(r"^(\d{1,6})([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
# Jobs with a gauge at once: the least recently computed one loses its series past this (bounded cardinality).
MAX_GAUGE_JOBS = 200
_STEP_MAX = 2**62  # a step number past this is not one (a bad explicit event): skipped


def parse_window(text: str) -> timedelta:
    """'1h', '30m', '2d', '90s' as a timedelta between MIN_WINDOW and MAX_WINDOW; InvalidInput otherwise."""
    m = _WINDOW.match(text.strip())
    if m is None:
        raise InvalidInput(f"window: {text!r} is not a duration like 30m, 1h or 2d")
    window = timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        raise InvalidInput(f"window: {text!r} must be between 1m and 30d")
    return window


def _step_number(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if 0 <= value < _STEP_MAX else None


def step_stream(session: Session, *, job: Job) -> int | None:
    """The rank whose step lines the ETTR follows: the one with the most of the newest STREAM_SAMPLE step lines
    (ties: the lowest rank; lines without a rank are a stream too).

    One stream, because ranks log the same steps a little apart: merged, their skew would read as restarts. A
    sample of the newest lines, not all of them: a big job's step lines are millions.
    """
    newest = (
        select(LogEvent.rank)
        .where(LogEvent.job_id == job.id, LogEvent.kind == "step")
        .order_by(LogEvent.ts.desc())
        .limit(STREAM_SAMPLE)
        .subquery()
    )
    row = session.execute(
        select(newest.c.rank)
        .group_by(newest.c.rank)
        .order_by(func.count().desc(), newest.c.rank.asc().nulls_last())
        .limit(1)
    ).first()
    return row[0] if row else None


def step_records(session: Session, *, job: Job) -> list[ettr.StepRecord]:
    """The step lines of the job's step stream, oldest first (the newest MAX_STEPS)."""
    rank = step_stream(session, job=job)
    rows = session.execute(
        select(LogEvent.ts, LogEvent.fields["step"])
        .where(LogEvent.job_id == job.id, LogEvent.kind == "step", LogEvent.rank.is_not_distinct_from(rank))
        .order_by(LogEvent.ts.desc())
        .limit(MAX_STEPS)
    ).all()
    records = [ettr.StepRecord(ts, step) for ts, value in rows if (step := _step_number(value)) is not None]
    return records[::-1]


def checkpoint_saves(session: Session, *, job: Job, steps: Sequence[ettr.StepRecord] = ()) -> list[ettr.CheckpointSave]:
    """The job's checkpoint saves that name a step, oldest first: its checkpoint_saved events (parsed save lines,
    or explicit events in a batch), and the saves its checkpoint_loaded events imply. A job that resumed from step
    N's checkpoint saved it when it first reached N (`steps`: the job's step records, which date it), so a log that
    shows loads but no save lines still says which checkpoint a restart went back to."""
    rows = session.execute(
        select(LogEvent.kind, LogEvent.ts, LogEvent.fields["step"])
        .where(LogEvent.job_id == job.id, LogEvent.kind.in_(("checkpoint_saved", "checkpoint_loaded")))
        .order_by(LogEvent.ts.desc())
        .limit(MAX_CHECKPOINTS)
    ).all()
    read = [(kind, ts, step) for kind, ts, value in rows[::-1] if (step := _step_number(value)) is not None]
    saves = [ettr.CheckpointSave(ts, step) for kind, ts, step in read if kind == "checkpoint_saved"]
    known = {c.step for c in saves}
    for kind, loaded_at, step in read:
        if kind == "checkpoint_loaded" and step not in known:
            reached = next((s.ts for s in steps if s.step >= step and s.ts <= loaded_at), None)
            # Without a step line that reached it (cut off, or no step lines), the load itself dates it: late,
            # but never after the restart it explains.
            saves.append(ettr.CheckpointSave(reached or loaded_at, step))
            known.add(step)
    return sorted(saves, key=lambda c: (c.ts, c.step))


def incident_spans(session: Session, *, job: Job) -> list[ettr.IncidentSpan]:
    """The job's incidents, merged-away ones left out (they repeat another incident)."""
    # Read here, not through service.incidents: incidents import jobs.
    rows = session.execute(
        select(Incident.id, Incident.opened_at, Incident.resolved_at, Incident.resolution)
        # A planned maintenance window's node going down is no failure of the job's (service/planned/).
        .where(Incident.job_id == job.id, not_planned(Incident.silence_id))
        .order_by(Incident.id)
    ).all()
    return [ettr.IncidentSpan(i, opened, resolved) for i, opened, resolved, why in rows if counts_against_ettr(why)]


def counts_against_ettr(resolution: str | None) -> bool:
    """A merged-away incident repeats another one's lost time: it does not count."""
    return not (resolution or "").startswith("merged")


def measurement_span(job: Job, steps: list[ettr.StepRecord], *, now: datetime) -> tuple[datetime, datetime]:
    """From the job's start (its creation, or an earlier step line) to now while it runs, else its last report.

    When the step lines read were cut at MAX_STEPS, from the first one read: the time before it is unknown, not
    lost (the answer's `cumulative.start` says so).
    """
    start = min([job.created_at, *(s.ts for s in steps[:1])])
    if len(steps) >= MAX_STEPS:
        start = steps[0].ts
    end = now if job.state == "running" else max([job.last_seen_at or now, *(s.ts for s in steps[-1:])])
    return start, max(start, end)


def job_ettr(
    session: Session,
    *,
    job: Job,
    now: datetime,
    window: timedelta = ettr.DEFAULT_WINDOW,
    points: int = ettr.DEFAULT_POINTS,
    incidents: Sequence[ettr.IncidentSpan] | None = None,
) -> ettr.EttrReport:
    """The job's ETTR report (see ml/ettr.py for the definitions); updates its gauges. `incidents`: the job's,
    when the caller has them already (else read)."""
    steps = step_records(session, job=job)
    start, end = measurement_span(job, steps, now=now)
    report = ettr.compute(
        steps,
        start=start,
        end=end,
        incidents=incident_spans(session, job=job) if incidents is None else incidents,
        checkpoints=checkpoint_saves(session, job=job, steps=steps),
        window=window,
        points=points,
    )
    publish(job.external_id, report)
    return report


_published: OrderedDict[str, None] = OrderedDict()
_lock = threading.Lock()


def publish(job_id: str, report: ettr.EttrReport) -> None:
    """Set faultline_job_ettr_ratio{job, span} (span: total, and 1h when the window is an hour); at most
    MAX_GAUGE_JOBS jobs keep series, the least recently computed lose theirs."""
    with _lock:
        _published[job_id] = None
        _published.move_to_end(job_id)
        while len(_published) > MAX_GAUGE_JOBS:
            old, _ = _published.popitem(last=False)
            for span in ("total", "1h"):
                with contextlib.suppress(KeyError):  # a span it never had
                    JOB_ETTR.remove(old, span)
        if report.cumulative.ratio is not None:
            JOB_ETTR.labels(job=job_id, span="total").set(report.cumulative.ratio)
        if report.window_s == ettr.DEFAULT_WINDOW.total_seconds() and report.window.ratio is not None:
            JOB_ETTR.labels(job=job_id, span="1h").set(report.window.ratio)


def describe(job_id: str, window: str, report: ettr.EttrReport) -> EttrOut:
    return EttrOut(
        job_id=job_id,
        window=window,
        window_s=report.window_s,
        cumulative=EttrSpanOut.model_validate(report.cumulative),
        sliding=EttrSpanOut.model_validate(report.window),
        median_step_s=report.median_step_s,
        pause_factor=report.pause_factor,
        highest_step=report.highest_step,
        steps_seen=report.steps_seen,
        checkpoints=report.checkpoints,
        last_checkpoint_step=report.last_checkpoint_step,
        restarts=[RestartOut.model_validate(r) for r in report.restarts],
        incidents=[IncidentLossOut.model_validate(i) for i in report.incidents],
        series=[EttrPointOut.model_validate(p) for p in report.series],
        stalls=[StallOut.model_validate(st) for st in report.stalls],
        lost=LostOut.model_validate(report.lost) if report.lost is not None else None,
    )
