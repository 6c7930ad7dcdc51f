"""Load a job's recent signals from the database into the plain shapes `ml/` detectors take."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import ColumnElement, Select, and_, false, func, or_, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from ml.findings import JobInfo, LogRecord, StackSample
from service.diagnosis import frames, repeats
from service.models import Job, LogEvent, Node, ProcessSnapshot, Rank, StackDump

# Step lines are the bulk of log events (one per rank per step): thinned per stream, and the newest kept.
MAX_STEP_EVENTS = 50_000
STEP_BUCKET_S = 10.0
# Process snapshots: the newest per rank and 10 s bucket, over this long (liveness needs 30 s, fail-slow's
# CPU rounds 50 s).
PROCESS_LOOKBACK_S = 60.0
_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
MAX_OTHER_EVENTS = 20_000
# Rows are read up to this long after the window's start: ingest refuses times a day ahead of its clock,
# and a row from before that rule (year 10000, say) must not fail every read of its job.
READ_HORIZON = timedelta(days=2)
# Alerts that began firing before the window and still fire are read back this far.
FIRING_ALERT_LOOKBACK = timedelta(hours=6)


def job_info(session: Session, *, job: Job) -> JobInfo:
    ranks = session.execute(
        select(Rank.rank, Node.name).join(Node, Node.id == Rank.node_id).where(Rank.job_id == job.id)
    ).all()
    return JobInfo(
        job_id=job.external_id,
        world_size=job.world_size or (len(ranks) or None),
        tp=job.tp or 1,
        pp=job.pp or 1,
        dp=job.dp,
        order=job.rank_order or "tp-dp-pp",
        hang_timeout_s=float(job.hang_timeout_s),
        rank_nodes={rank: node for rank, node in ranks},
    )


def _of_job(job: Job, node_ids: list[int]) -> ColumnElement[bool]:
    """The job's own lines, plus its nodes' lines that name no job (kernel, host)."""
    return or_(
        LogEvent.job_id == job.id,
        and_(LogEvent.job_id.is_(None), LogEvent.node_id.in_(node_ids)) if node_ids else false(),
    )


def thinning_s(job: Job, span_s: float) -> float:
    """Seconds per thinning bucket for a job's step lines and process snapshots: 0 (every row, the
    resolution fail-slow's rounds are tuned for) while one row per stream per second over the span fits
    MAX_STEP_EVENTS; else STEP_BUCKET_S, so a pass of a big job reads a bounded number of rows."""
    streams = max(job.world_size or 0, 1)
    return 0.0 if streams * span_s <= MAX_STEP_EVENTS else STEP_BUCKET_S


def log_records(
    session: Session, *, job: Job, node_ids: list[int], since: datetime, span_s: float = 300.0
) -> tuple[list[LogRecord], list[LogRecord]]:
    """(step events, all other events) since a time: the job's own, plus its nodes' kernel lines."""
    lines = _log_select().where(
        _of_job(job, node_ids), LogEvent.ts >= since, LogEvent.ts < since + READ_HORIZON, LogEvent.kind == "step"
    )
    bucket_s = thinning_s(job, span_s)
    if bucket_s:
        # A big job: the newest step line per logging stream and bucket. Progress and fail-slow need a stream's
        # pace, not each of its lines (thousands of ranks log thousands of step lines a second).
        # NaN and spike lines are events of their own kinds, never thinned.
        bucket = func.date_bin(timedelta(seconds=bucket_s), LogEvent.ts, _ORIGIN)
        thinned = (
            lines.add_columns(bucket.label("bucket"))
            .ext(distinct_on(LogEvent.node_id, LogEvent.rank, bucket))
            .order_by(LogEvent.node_id, LogEvent.rank, bucket, LogEvent.ts.desc())
            .subquery()
        )
        query = select(*thinned.c[: len(thinned.c) - 1]).order_by(thinned.c.ts.desc())
    else:
        query = lines.order_by(LogEvent.ts.desc())
    steps = session.execute(query.limit(MAX_STEP_EVENTS)).all()
    return _records(reversed(steps)), event_records(session, job=job, node_ids=node_ids, since=since)


def event_records(session: Session, *, job: Job, node_ids: list[int], since: datetime) -> list[LogRecord]:
    """Every event but step lines since a time, oldest first, after the alerts still firing from before it."""
    of_job = _of_job(job, node_ids)
    others = session.execute(
        _log_select()
        .where(of_job, LogEvent.ts >= since, LogEvent.ts < since + READ_HORIZON, LogEvent.kind != "step")
        .order_by(LogEvent.ts.desc())
        .limit(MAX_OTHER_EVENTS)
    ).all()
    # An alert's time is when it started firing: one still firing counts however long ago that was.
    firing = session.execute(
        _log_select()
        .where(
            of_job,
            LogEvent.source == "alertmanager",
            LogEvent.ts < since,
            LogEvent.ts >= since - FIRING_ALERT_LOOKBACK,
            LogEvent.fields["status"].astext == "firing",
        )
        .order_by(LogEvent.ts)
        .limit(MAX_OTHER_EVENTS)
    ).all()
    records = _records(firing) + _records(reversed(others))
    return repeats.mark_repeated(session, job=job, records=records, horizon=READ_HORIZON)


def _log_select() -> Select[Any]:
    return select(
        LogEvent.id,
        LogEvent.ts,
        Node.name,
        LogEvent.kind,
        LogEvent.line,
        LogEvent.severity,
        LogEvent.rank,
        LogEvent.source,
        LogEvent.fields,
    ).join(Node, Node.id == LogEvent.node_id)


def _records(rows) -> list[LogRecord]:  # type: ignore[no-untyped-def]
    return [
        LogRecord(id=i, ts=ts, node=node, kind=kind, line=line, severity=sev, rank=rank, source=src, fields=f or {})
        for i, ts, node, kind, line, sev, rank, src, f in rows
    ]


def last_step_before(session: Session, *, job: Job, before: datetime) -> LogRecord | None:
    """The newest step event older than the window, so a hang longer than the window is still seen."""
    row = session.execute(
        _log_select()
        .where(LogEvent.job_id == job.id, LogEvent.kind == "step", LogEvent.ts < before)
        .order_by(LogEvent.ts.desc())
        .limit(1)
    ).first()
    return _records([row])[0] if row else None


_PROCESSES = (
    "SELECT p.ts, n.name, p.rank, p.pid, p.cpu_pct, p.rss_bytes, p.state "
    "FROM process_snapshots p JOIN nodes n ON n.id = p.node_id "
    "WHERE p.job_id = %(job)s AND p.ts >= %(since)s AND p.ts < %(until)s"
)
# A big job's: the newest per rank and bucket.
_PROCESSES_THINNED = (
    "SELECT DISTINCT ON (p.node_id, p.rank, p.pid, bucket) p.ts, n.name, p.rank, p.pid, p.cpu_pct, p.rss_bytes, "
    "p.state, date_bin(make_interval(secs => %(bucket)s), p.ts, %(origin)s) AS bucket "
    "FROM process_snapshots p JOIN nodes n ON n.id = p.node_id "
    "WHERE p.job_id = %(job)s AND p.ts >= %(since)s AND p.ts < %(until)s "
    "ORDER BY p.node_id, p.rank, p.pid, bucket, p.ts DESC"
)
_PROCESS_COLUMNS = ["ts", "node", "rank", "pid", "cpu_pct", "rss_bytes", "state"]


def processes_frame(session: Session, *, job: Job, now: datetime) -> pd.DataFrame:
    """The job's process snapshots of the last PROCESS_LOOKBACK_S (a big job's thinned, see thinning_s)."""
    bucket_s = thinning_s(job, PROCESS_LOOKBACK_S)
    params: dict[str, Any] = {
        "job": job.id,
        "since": now - timedelta(seconds=PROCESS_LOOKBACK_S),
        "until": now + READ_HORIZON,
    }
    if bucket_s:
        params |= {"bucket": bucket_s, "origin": _ORIGIN}
    columns = [*_PROCESS_COLUMNS, "bucket"] if bucket_s else _PROCESS_COLUMNS
    frame = frames.copy_frame(
        session,
        _PROCESSES_THINNED if bucket_s else _PROCESSES,
        params,
        columns=columns,
        floats=("cpu_pct", "rss_bytes"),
        times=("ts",),
    )
    frame["rank"] = frame["rank"].astype("Int64")
    return frame.drop(columns=["bucket"], errors="ignore").sort_values("ts", kind="stable").reset_index(drop=True)


def stack_samples_for(session: Session, *, directive_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[StackSample]]:
    """One sample per rank (its newest dump if it sent several) for each stack-dump request, in one query: every
    id given maps to its samples ([] if none came)."""
    wanted = {str(d): d for d in directive_ids}  # dumps hold their request's id as text
    if not wanted:
        return {}
    rows = session.execute(
        select(
            StackDump.directive_id,
            StackDump.id,
            StackDump.rank,
            Node.name,
            StackDump.pid,
            StackDump.threads,
            StackDump.ts,
        )
        .join(Node, Node.id == StackDump.node_id)
        .where(StackDump.directive_id.in_(list(wanted)), StackDump.rank.is_not(None))
        .order_by(StackDump.rank, StackDump.ts)
    ).all()
    by_rank: dict[uuid.UUID, dict[int, StackSample]] = {d: {} for d in wanted.values()}
    # Oldest first within a rank, so a rank's newest dump is the one left.
    for key, sid, rank, node, pid, threads, ts in rows:
        by_rank[wanted[key]][rank] = StackSample(rank=rank, node=node, pid=pid, threads=threads or [], id=sid, ts=ts)
    return {d: list(samples.values()) for d, samples in by_rank.items()}


def processes_before(session: Session, *, job: Job, since: datetime, until: datetime) -> set[tuple[str, int]]:
    """(node, pid) of the job's processes the agents reported in a time range."""
    rows = session.execute(
        select(Node.name, ProcessSnapshot.pid)
        .join(Node, Node.id == ProcessSnapshot.node_id)
        .where(ProcessSnapshot.job_id == job.id, ProcessSnapshot.ts >= since, ProcessSnapshot.ts <= until)
        .distinct()
    ).all()
    return {(node, int(pid)) for node, pid in rows if pid is not None}


def stopped_by_launcher(session: Session, *, job: Job, since: datetime, until: datetime) -> set[tuple[str, int]]:
    """(node, pid) of the job's processes its launchers stopped in a time range (torchrun's `Sending process N
    closing signal SIGTERM`, DeepSpeed's `Killing subprocess N`): gone because the job is being torn down
    (a restart, a preemption, a peer's crash), not because their own machine failed."""
    rows = session.execute(
        select(Node.name, LogEvent.fields["pid"].astext)
        .join(Node, Node.id == LogEvent.node_id)
        .where(
            LogEvent.job_id == job.id,
            LogEvent.kind == "elastic_error",
            LogEvent.fields["category"].astext == "closing_signal",
            LogEvent.ts >= since,
            LogEvent.ts <= until,
        )
    ).all()
    return {(node, int(pid)) for node, pid in rows if pid is not None and pid.isdigit()}


def window_start(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)
