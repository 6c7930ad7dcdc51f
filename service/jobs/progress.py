"""Jobs not getting anywhere: each running job's progress mark (the highest step it logged and when it first got
there), kept by beat, and the jobs whose mark has not moved for longer than `job_no_progress_s`, with why.

The mark is kept incrementally because the question "has the job gone past its highest step lately?" needs the
job's whole history, and reading that on every overview refresh would read millions of step lines: every 15 s
(service/worker.py) the beat folds the step lines since its last pass (and OVERLAP before, for lines that arrived
late) into the mark. Folding is idempotent (a maximum and the earliest time it was logged), so lines read twice
change nothing. The mark lives in `detector_states` (a job's running state between passes) under MARK.

A job is stalled when its mark is older than the threshold: `job_no_progress_s`, or 3x the job's usual time
between step lines when it logs less often than that. Why (ml/stalls.py) is read only for the stalled ones, in a
fixed number of queries however many there are.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Text, and_, cast, delete, func, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ml import stalls
from ml.ettr import CheckpointSave, StepRecord
from service.jobs.schemas import StalledIncidentOut, StalledJobOut, StalledJobsOut
from service.models import Decision, DetectorState, Incident, Job, Node, ProcessSnapshot

MARK = "progress_mark"
MARK_VERSION = 1
OVERLAP = timedelta(seconds=60)
BOOTSTRAP = timedelta(hours=24)  # a job without a mark is read back this far, once
# A running job no agent has reported for this long has gone without an end being recorded: not listed.
GONE = timedelta(hours=24)
PACES = 9  # the latest times between step lines kept; their median is the job's pace
LOG_GAP_FACTOR = 3.0  # as the hang detector (ml/progress.py): a job logging every N s is not stalled before 3 N s
# Read back per stalled job to say why: the newest step lines of the stream that reached the mark.
MAX_RECORDS = 5000
PROCESSES_FRESH = timedelta(seconds=30)  # process snapshots newer than this say a process lives
_DEAD = ("z", "x", "zombie", "dead")
_STEP_MAX = 2**62
# Rows are read up to this far past now: an agent's clock a little ahead is not a row lost.
_AHEAD = timedelta(days=1)
STALLED_LIMIT = 50


@dataclass(frozen=True)
class Mark:
    high: int | None = None
    high_at: datetime | None = None
    high_rank: int | None = None  # the rank that logged the high step first: the stream read back for the why
    last_at: datetime | None = None  # the newest step line seen
    paces: tuple[float, ...] = ()

    @property
    def pace_s(self) -> float | None:
        return statistics.median(self.paces) if self.paces else None

    def to_json(self) -> dict[str, Any]:
        return {
            "high": self.high,
            "high_at": self.high_at.isoformat() if self.high_at else None,
            "high_rank": self.high_rank,
            "last_at": self.last_at.isoformat() if self.last_at else None,
            "paces": list(self.paces),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Mark:
        data = data or {}
        at = {k: datetime.fromisoformat(data[k]) if data.get(k) else None for k in ("high_at", "last_at")}
        return cls(data.get("high"), at["high_at"], data.get("high_rank"), at["last_at"], tuple(data.get("paces", ())))


@dataclass(frozen=True)
class Chunk:
    """A job's step lines since the last pass, summed up."""

    top: int
    top_at: datetime
    top_rank: int | None
    last_at: datetime
    fresh: int  # distinct steps above the mark's high
    fresh_at: datetime | None  # the first line above it


def advance(mark: Mark, chunk: Chunk) -> Mark:
    """The mark after a chunk of step lines: idempotent, so lines read twice change nothing."""
    last_at = max(t for t in (mark.last_at, chunk.last_at) if t is not None)
    if mark.high is None or chunk.top > mark.high:
        paces = list(mark.paces)
        if mark.high_at is not None and chunk.fresh_at is not None:
            paces.append(max(0.0, (chunk.fresh_at - mark.high_at).total_seconds()))
        if chunk.fresh >= 2 and chunk.fresh_at is not None:
            paces.append((chunk.top_at - chunk.fresh_at).total_seconds() / (chunk.fresh - 1))
        return Mark(chunk.top, chunk.top_at, chunk.top_rank, last_at, tuple(paces[-PACES:]))
    if chunk.top == mark.high and mark.high_at is not None and chunk.top_at < mark.high_at:
        return replace(mark, high_at=chunk.top_at, high_rank=chunk.top_rank, last_at=last_at)
    return replace(mark, last_at=last_at)


_CHUNKS = text(
    """
WITH s AS (
  SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:sinces AS timestamptz[]), CAST(:highs AS numeric[]))
    AS s(job_id, since, high)
), w AS (
  SELECT e.job_id, e.ts, e.rank, s.high,
    CASE WHEN jsonb_typeof(e.fields -> 'step') = 'number' THEN (e.fields ->> 'step')::numeric END AS step
  FROM log_events e JOIN s ON e.job_id = s.job_id AND e.ts >= s.since
  WHERE e.kind = 'step' AND e.ts >= :lo AND e.ts < :hi
), v AS (
  SELECT * FROM w WHERE step >= 0 AND step < :step_max AND step = trunc(step)
), h AS (
  SELECT job_id, max(step) AS top, max(ts) AS last_at FROM v GROUP BY job_id
)
SELECT h.job_id, h.top, h.last_at,
  min(v.ts) FILTER (WHERE v.step = h.top) AS top_at,
  (array_agg(v.rank ORDER BY v.ts) FILTER (WHERE v.step = h.top))[1] AS top_rank,
  count(DISTINCT v.step) FILTER (WHERE v.step > coalesce(v.high, -1)) AS fresh,
  min(v.ts) FILTER (WHERE v.step > coalesce(v.high, -1)) AS fresh_at
FROM h JOIN v ON v.job_id = h.job_id
GROUP BY h.job_id, h.top, h.last_at
"""
)


def _marks(session: Session, *, job_ids: Sequence[int]) -> dict[int, tuple[datetime | None, Mark]]:
    rows = session.execute(
        select(DetectorState.job_id, DetectorState.cursor, DetectorState.state).where(
            DetectorState.job_id.in_(job_ids), DetectorState.detector == MARK, DetectorState.version == MARK_VERSION
        )
    ).all()
    return {job_id: (cursor, Mark.from_json(state)) for job_id, cursor, state in rows}


def track(session: Session, *, now: datetime) -> int:
    """Fold every running job's step lines since the last pass into its mark; how many marks moved."""
    running = dict(session.execute(select(Job.id, Job.updated_at).where(Job.state == "running").order_by(Job.id)).all())
    # An ended job's mark goes: the same id registered again is a new run, whose steps start over.
    session.execute(
        delete(DetectorState).where(DetectorState.detector == MARK, DetectorState.job_id.not_in(list(running) or [0]))
    )
    job_ids = list(running)
    if not job_ids:
        return 0
    stored = _marks(session, job_ids=job_ids)
    # Without a mark, from the job's last registration (a new run of a reused id), at most BOOTSTRAP back.
    sinces = {
        j: (stored[j][0] - OVERLAP) if j in stored and stored[j][0] else max(now - BOOTSTRAP, running[j])
        for j in job_ids
    }
    marks = {j: stored[j][1] if j in stored else Mark() for j in job_ids}
    rows = session.execute(
        _CHUNKS,
        {
            "ids": job_ids,
            "sinces": [sinces[j] for j in job_ids],
            "highs": [marks[j].high for j in job_ids],
            "lo": min(sinces.values()),
            "hi": now + _AHEAD,
            "step_max": _STEP_MAX,
        },
    ).all()
    moved = 0
    for r in rows:
        chunk = Chunk(int(r.top), r.top_at, r.top_rank, r.last_at, int(r.fresh), r.fresh_at)
        new = advance(marks[r.job_id], chunk)
        moved += new.high != marks[r.job_id].high or new.high_at != marks[r.job_id].high_at
        marks[r.job_id] = new
    values = [
        {
            "job_id": j,
            "detector": MARK,
            "version": MARK_VERSION,
            "cursor": now,
            "state": marks[j].to_json(),
            "updated_at": now,
        }
        for j in job_ids
    ]
    stmt = insert(DetectorState).values(values)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["job_id", "detector"],
            set_={c: stmt.excluded[c] for c in ("version", "cursor", "state", "updated_at")},
        )
    )
    session.flush()
    return moved


# --- the stalled jobs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobIncident:
    id: int
    root_cause: str
    severity: str
    state: str


@dataclass
class StalledJob:
    job_id: str
    step: int  # the highest step reached
    since: datetime  # when it was first reached: no net progress since
    stalled_s: float
    threshold_s: float  # past this without progress a job is listed (job_no_progress_s, or its logging pace)
    reason: stalls.StallReason
    world_size: int | None
    processes_alive: int | None
    last_seen_at: datetime | None
    incidents: list[JobIncident] = field(default_factory=list)  # open ones, and those opened since `since`


_RECORDS = text(
    """
SELECT s.job_id, r.ts, r.step
FROM unnest(CAST(:ids AS bigint[]), CAST(:ranks AS int[]), CAST(:sinces AS timestamptz[])) AS s(job_id, rank, since)
CROSS JOIN LATERAL (
  SELECT e.ts, CASE WHEN jsonb_typeof(e.fields -> 'step') = 'number' THEN (e.fields ->> 'step')::numeric END AS step
  FROM log_events e
  WHERE e.job_id = s.job_id AND e.kind = 'step' AND e.rank IS NOT DISTINCT FROM s.rank
    AND e.ts >= s.since AND e.ts < :hi
  ORDER BY e.ts DESC LIMIT :n
) r
"""
)

_CHECKPOINTS = text(
    """
SELECT s.job_id, max(c.step) AS step, max(c.ts) AS ts
FROM unnest(CAST(:ids AS bigint[]), CAST(:highs AS numeric[])) AS s(job_id, high)
JOIN LATERAL (
  SELECT e.ts, CASE WHEN jsonb_typeof(e.fields -> 'step') = 'number' THEN (e.fields ->> 'step')::numeric END AS step
  FROM log_events e
  WHERE e.job_id = s.job_id AND e.kind = 'checkpoint_saved' AND e.ts >= :lo AND e.ts < :hi
) c ON c.step <= s.high AND c.step >= 0
GROUP BY s.job_id
"""
)


def _candidates(session: Session, *, now: datetime, after_s: float) -> list[tuple[Job, Mark, float]]:
    rows = session.execute(
        select(Job, DetectorState.state)
        .join(
            DetectorState,
            and_(
                DetectorState.job_id == Job.id,
                DetectorState.detector == MARK,
                DetectorState.version == MARK_VERSION,
            ),
        )
        .where(Job.state == "running")
    ).all()
    out = []
    for job, state in rows:
        mark = Mark.from_json(state)
        if mark.high is None or mark.high_at is None:
            continue
        if job.last_seen_at is not None and now - job.last_seen_at > GONE:
            continue
        threshold = max(after_s, LOG_GAP_FACTOR * (mark.pace_s or 0.0))
        if (now - mark.high_at).total_seconds() > threshold:
            out.append((job, mark, threshold))
    return sorted(out, key=lambda c: (c[1].high_at, c[0].id))


def stalled(session: Session, *, now: datetime, after_s: float, limit: int = STALLED_LIMIT) -> list[StalledJob]:
    """Running jobs with no net progress for longer than `after_s` (or 3x their logging pace), longest first, with
    why: in a fixed number of queries however many there are."""
    candidates = _candidates(session, now=now, after_s=after_s)[:limit]
    if not candidates:
        return []
    ids = [job.id for job, _, _ in candidates]
    records: dict[int, list[StepRecord]] = {i: [] for i in ids}
    for job_id, ts, step in session.execute(
        _RECORDS,
        {
            "ids": ids,
            "ranks": [m.high_rank for _, m, _ in candidates],
            "sinces": [m.high_at for _, m, _ in candidates],
            "hi": now + _AHEAD,
            "n": MAX_RECORDS,
        },
    ):
        if step is not None and 0 <= step < _STEP_MAX and step == int(step):
            records[job_id].append(StepRecord(ts, int(step)))
    saves = {
        r.job_id: CheckpointSave(r.ts, int(r.step))
        for r in session.execute(
            _CHECKPOINTS,
            {"ids": ids, "highs": [m.high for _, m, _ in candidates], "lo": now - BOOTSTRAP, "hi": now + _AHEAD},
        )
    }
    alive = _processes_alive(session, job_ids=ids, now=now)
    actions = _actions(session, job_ids=ids, since=min(m.high_at for _, m, _ in candidates if m.high_at))
    incidents = _incidents(session, job_ids=ids, since=min(m.high_at for _, m, _ in candidates if m.high_at))
    out = []
    for job, mark, threshold in candidates:
        since, high = mark.high_at or now, mark.high or 0  # _candidates kept only marks with both
        steps = sorted(records[job.id], key=lambda s: s.ts)
        if any(s.step > high for s in steps):
            continue  # the mark is behind (beat has not run since): the job went past it
        reason = stalls.explain(
            high=high,
            since=since,
            now=now,
            steps=steps,
            actions=[a for a in actions.get(job.id, []) if _relevant(a, since)],
            processes_alive=alive.get(job.id),
            world_size=job.world_size,
            checkpoints=[saves[job.id]] if job.id in saves else [],
        )
        out.append(
            StalledJob(
                job_id=job.external_id,
                step=high,
                since=since,
                stalled_s=(now - since).total_seconds(),
                threshold_s=threshold,
                reason=reason,
                world_size=job.world_size,
                processes_alive=alive.get(job.id),
                last_seen_at=job.last_seen_at,
                incidents=[i for i, opened in incidents.get(job.id, []) if i.state != "resolved" or opened >= since],
            )
        )
    return out


def _relevant(action: stalls.Action, since: datetime) -> bool:
    """A remedy still waiting, or one decided or carried out since the job stopped progressing."""
    return (
        action.state in ("pending", "awaiting_approval")
        or max(action.created_at, action.acked_at or action.created_at) >= since
    )


def _processes_alive(session: Session, *, job_ids: list[int], now: datetime) -> dict[int, int]:
    """Live processes per job in its latest snapshots; a job without any snapshot for long is absent (unknown)."""
    p = ProcessSnapshot
    fresh = and_(
        p.ts >= now - PROCESSES_FRESH, p.ts < now + _AHEAD, or_(p.state.is_(None), func.lower(p.state).not_in(_DEAD))
    )
    rows = session.execute(
        select(p.job_id, func.count(func.distinct(func.concat(p.node_id, ":", p.pid))).filter(fresh))
        .where(p.job_id.in_(job_ids), p.ts >= now - BOOTSTRAP, p.ts < now + _AHEAD)
        .group_by(p.job_id)
    ).all()
    return {job_id: n for job_id, n in rows}


def _actions(session: Session, *, job_ids: list[int], since: datetime) -> dict[int, list[stalls.Action]]:
    rows = session.execute(
        select(
            Decision.job_id,
            Decision.id,
            Decision.kind,
            Node.name,
            # A reset_gpu names its GPU by index, else by PCI bus id: the reason shows whichever it has.
            func.coalesce(cast(Decision.gpu, Text), Decision.gpu_pci),
            Decision.state,
            Decision.created_at,
            Decision.acked_at,
            Decision.outcome_message,
        )
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(
            Decision.job_id.in_(job_ids),
            Decision.kind.in_(stalls.REMEDIES),
            or_(
                Decision.state.in_(("pending", "awaiting_approval")),
                Decision.created_at >= since,
                Decision.acked_at >= since,
            ),
        )
        .order_by(Decision.id)
    ).all()
    out: dict[int, list[stalls.Action]] = {}
    for job_id, *rest in rows:
        out.setdefault(job_id, []).append(stalls.Action(*rest))
    return out


def _incidents(
    session: Session, *, job_ids: list[int], since: datetime
) -> dict[int, list[tuple[JobIncident, datetime]]]:
    rows = session.execute(
        select(Incident.job_id, Incident.id, Incident.root_cause, Incident.severity, Incident.state, Incident.opened_at)
        .where(
            Incident.job_id.in_(job_ids),
            or_(Incident.state != "resolved", Incident.opened_at >= since),
            or_(Incident.resolution.is_(None), ~Incident.resolution.startswith("merged")),
        )
        .order_by(Incident.id)
    ).all()
    out: dict[int, list[tuple[JobIncident, datetime]]] = {}
    for job_id, incident_id, root_cause, severity, state, opened in rows:
        out.setdefault(job_id, []).append((JobIncident(incident_id, root_cause, severity, state), opened))
    return out


def describe(items: Sequence[StalledJob], *, after_s: float, now: datetime) -> StalledJobsOut:
    """The API's form of the stalled list."""
    return StalledJobsOut(
        after_s=after_s,
        checked_at=now,
        items=[
            StalledJobOut(
                job_id=s.job_id,
                step_reached=s.step,
                since=s.since,
                stalled_s=s.stalled_s,
                threshold_s=s.threshold_s,
                reason=s.reason.kind,  # type: ignore[arg-type]
                summary=s.reason.text,
                details=s.reason.details,
                restarts=s.reason.restarts,
                restart_steps=list(s.reason.restart_steps),
                checkpoint_step=s.reason.checkpoint_step,
                last_step=s.reason.last_step,
                last_step_at=s.reason.last_step_at,
                decision_id=s.reason.action_id,
                processes_alive=s.processes_alive,
                world_size=s.world_size,
                last_seen_at=s.last_seen_at,
                incidents=[StalledIncidentOut.model_validate(i) for i in s.incidents],
            )
            for s in items
        ],
    )
