"""The training time a job's incidents cost it: each stall charged once, to the incident that caused it (ml/ettr.py
`cause`), most costly first, with a total that is the job's ETTR arithmetic: lost = wall x (1 - ETTR).

From step progress when the job logs steps: a stall is a stretch of lost time between step lines (ml/ettr.py), and
the time no incident explains (start-up, checkpoint saves and other pauses, the wait for the next step line) is
shown beside the incidents' share, so the parts add up to the job's lost time. Before any step line, the estimate:
the job's lost time is the union of its incidents' open intervals (opened -> resolved, or now); each stretch of that
union is charged to the incident that opened it, so two incidents open at once cost that time once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml import ettr as ml_ettr
from service.jobs.ettr import counts_against_ettr
from service.models import Incident, Job

Interval = tuple[datetime, datetime]
COSTLY_LIMIT = 50


# --- intervals (the estimate before step lines) ------------------------------------------------------------


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals as disjoint, sorted intervals (touching ones joined); empty ones dropped."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def covered_seconds(intervals: Iterable[Interval], *, start: datetime, end: datetime) -> float:
    """Seconds of [start, end] that at least one interval covers."""
    clipped = ((max(a, start), min(b, end)) for a, b in intervals)
    return sum((b - a).total_seconds() for a, b in merge_intervals(clipped))


@dataclass(frozen=True)
class Ettr:
    start: datetime
    end: datetime
    lost_s: float

    @property
    def wall_s(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    @property
    def productive_s(self) -> float:
        return max(0.0, self.wall_s - self.lost_s)

    @property
    def ratio(self) -> float | None:
        """Productive / wall time; None for an empty window."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None


def ettr(lost: Iterable[Interval], *, start: datetime, end: datetime) -> Ettr:
    """The effective training time ratio over [start, end], given the intervals the job lost."""
    return Ettr(start=start, end=end, lost_s=covered_seconds(lost, start=start, end=end) if end > start else 0.0)


def incident_interval(opened_at: datetime, resolved_at: datetime | None, *, now: datetime) -> Interval:
    """The time an incident cost: from its opening to its resolution, or to now while it is open."""
    return opened_at, resolved_at or now


def job_window(created_at: datetime, last_seen_at: datetime | None, *, running: bool, now: datetime) -> Interval:
    """The job's life: from its creation to now while it runs, else to the last time an agent reported it.

    A running job whose agents went quiet (a GPU fell off the bus, the job hangs) is still losing time: its
    window runs to now, or a dead job would look healthier the longer it stays dead.
    """
    end = now if running else last_seen_at or now
    return created_at, max(created_at, end)


def estimated_stalls(spans: Sequence[ml_ettr.IncidentSpan], *, start: datetime, end: datetime) -> list[ml_ettr.Stall]:
    """Before any step line: each stretch of the union of the incidents' open intervals within [start, end] as a
    stall, charged to the incident that opened it (the others open in it listed, not charged)."""
    intervals = [(max(s.opened_at, start), min(s.resolved_at or end, end)) for s in spans]
    out = []
    for a, b in merge_intervals(intervals):
        charged, also = ml_ettr.cause(spans, start=a, end=b, ongoing=b >= end)
        lost = (b - a).total_seconds()
        out.append(ml_ettr.Stall(a, b, lost, charged, also, False, None, None, None, 0, 0, lost, 0.0, b >= end))
    return out


# --- the cost table ----------------------------------------------------------------------------------------


@dataclass
class CostRow:
    id: int
    state: str
    severity: str
    root_cause: str
    blame: str
    summary: str | None
    opened_at: datetime
    resolved_at: datetime | None
    lost_s: float  # the stalls charged to it
    stalls: int
    restarts: int
    steps_redone: int
    ongoing: bool
    also: list[int] = field(default_factory=list)  # other incidents open in its stalls: not charged for them


@dataclass
class CostTable:
    rows: list[CostRow]  # most costly first, at most COSTLY_LIMIT
    more: int  # costly incidents beyond the limit (the total counts them)
    from_steps: bool  # False: estimated from the incidents' open time, before any step line
    wall_s: float
    productive_s: float
    ratio: float | None
    lost_s: float  # wall - productive = wall x (1 - ratio)
    charged_s: float  # to the incidents (all of them, listed or not)
    startup_s: float  # before the first step line, no incident open
    unexplained_s: float  # stalls and pauses (checkpoint saves) no incident explains
    pending_s: float  # since the last step line, the next one not yet due
    stalls: list[ml_ettr.Stall]  # every stretch of lost time, oldest first
    free: int  # incidents that cost no time (open while the job trained, or in another's stall only)
    merged: int  # merged-away incidents: duplicates, not counted

    @property
    def shown_stalls(self) -> tuple[list[ml_ettr.Stall], int, float]:
        return biggest(self.stalls)


def job_incidents(session: Session, *, job: Job) -> Sequence[Incident]:
    """Every incident of the job, resolved ones included, oldest first."""
    # Read here, not through service.incidents: incidents import jobs.
    return session.scalars(select(Incident).where(Incident.job_id == job.id).order_by(Incident.id)).all()


def cost_table(
    incidents: Sequence[Incident],
    *,
    report: ml_ettr.EttrReport,
    estimate: Ettr,
    limit: int = COSTLY_LIMIT,
) -> CostTable:
    """The cost table from the job's ETTR report (or, without step lines, the estimate over `estimate`'s span)."""
    counted = [i for i in incidents if counts_against_ettr(i.resolution)]
    from_steps = bool(report.steps_seen) and report.lost is not None
    if from_steps and report.lost is not None:
        stalls, lost = report.stalls, report.lost
        wall, productive, ratio = report.cumulative.wall_s, report.cumulative.productive_s, report.cumulative.ratio
        parts = (lost.total_s, lost.charged_s, lost.startup_s, lost.unexplained_s, lost.pending_s)
    else:
        spans = [ml_ettr.IncidentSpan(i.id, i.opened_at, i.resolved_at) for i in counted]
        stalls = estimated_stalls(spans, start=estimate.start, end=estimate.end)
        wall, productive, ratio = estimate.wall_s, estimate.productive_s, estimate.ratio
        charged = sum(s.lost_s for s in stalls if s.incident_id is not None)
        parts = (estimate.lost_s, charged, 0.0, 0.0, 0.0)
    by_id = {i.id: i for i in counted}
    rows: dict[int, CostRow] = {}
    for s in stalls:
        if s.incident_id is None or s.incident_id not in by_id:
            continue
        i = by_id[s.incident_id]
        row = rows.get(i.id) or CostRow(
            i.id, i.state, i.severity, i.root_cause, i.blame, i.summary, i.opened_at, i.resolved_at, 0.0, 0, 0, 0, False
        )
        row.lost_s += s.lost_s
        row.stalls += 1
        row.restarts += s.restarts
        row.steps_redone += s.steps_redone
        row.ongoing = row.ongoing or s.ongoing
        row.also.extend(x for x in s.also if x not in row.also)
        rows[i.id] = row
    ordered = sorted(rows.values(), key=lambda r: (-r.lost_s, -r.id))
    return CostTable(
        rows=ordered[:limit],
        more=max(0, len(ordered) - limit),
        from_steps=from_steps,
        wall_s=wall,
        productive_s=productive,
        ratio=ratio,
        lost_s=parts[0],
        charged_s=parts[1],
        startup_s=parts[2],
        unexplained_s=parts[3],
        pending_s=parts[4],
        stalls=stalls,
        free=len(counted) - len(rows),
        merged=len(incidents) - len(counted),
    )


STALLS_SHOWN = 20


def biggest(stalls: Sequence[ml_ettr.Stall], *, limit: int = STALLS_SHOWN) -> tuple[list[ml_ettr.Stall], int, float]:
    """The `limit` costliest stalls in time order, and how many others there are and what they lost (a long job
    pauses at every checkpoint save: hundreds of small stalls)."""
    kept = sorted(sorted(stalls, key=lambda s: -s.lost_s)[:limit], key=lambda s: s.start)
    rest = [s for s in stalls if s not in kept]
    return kept, len(rest), sum(s.lost_s for s in rest)
