"""Jobs: the list, and one job's ranks on nodes, its parallel groups, and the training time incidents cost it.

ETTR (effective training time ratio) = productive time / wall time over a window: the job's life (from its
creation to now while it runs, to its last report once it ended), or the last hour of it. The time lost is
the union of the job's incident intervals [opened_at, resolved_at or now] clipped to the window: two
incidents open at once lose that time once. Merged-away incidents (resolution "merged...") are duplicates
of another and do not count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy.orm import Session

from ml import parallel
from ml.ettr import EttrReport, IncidentLoss, IncidentSpan
from ml.findings import JobInfo
from service.incidents import service as incidents
from service.jobs import ettr as step_ettr
from service.jobs import service as jobs
from service.jobs.schemas import JobOut
from service.jobs.signal_sources import SignalSource, job_signal_sources
from service.models import Incident
from service.ui import plots

Interval = tuple[datetime, datetime]
RECENT = timedelta(hours=1)
# A grid taller than this is cut: past a few hundred DP replicas nobody reads cells, they filter by node.
GRID_MAX_REPLICAS = 512
COSTLY_LIMIT = 50
# Worst first: the colour of a grid cell is its worst node's state.
_STATE_RANK = {s: i for i, s in enumerate(("evicted", "in_repair", "cordoned", "suspect", "returned", "healthy"))}


# --- ETTR: pure functions over intervals -------------------------------------------------------------------


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


counts_against_ettr = step_ettr.counts_against_ettr


def job_window(created_at: datetime, last_seen_at: datetime | None, *, running: bool, now: datetime) -> Interval:
    """The job's life: from its creation to now while it runs, else to the last time an agent reported it.

    A running job whose agents went quiet (a GPU fell off the bus, the job hangs) is still losing time: its
    window runs to now, or a dead job would look healthier the longer it stays dead.
    """
    end = now if running else last_seen_at or now
    return created_at, max(created_at, end)


# --- the list ----------------------------------------------------------------------------------------------


@dataclass
class JobRow:
    job_id: str
    state: str
    world_size: int | None
    tp: int | None
    pp: int | None
    dp: int | None
    rank_order: str | None
    nodes: int
    open_incidents: int
    created_at: datetime
    last_seen_at: datetime | None

    @property
    def has_parallelism(self) -> bool:
        return bool(self.tp and self.pp and self.dp)


@dataclass
class JobListPage:
    items: list[JobRow]
    next_cursor: str | None


def list_jobs(session: Session, *, state: str | None, name: str | None, limit: int, cursor: str | None) -> JobListPage:
    """Newest first, keyset-paginated on id, with node and open-incident counts: one query a page."""
    rows, next_cursor = jobs.list_with_counts(session, state=state, name=name, limit=limit, cursor=cursor)
    items = [
        JobRow(
            job_id=j.external_id,
            state=j.state,
            world_size=j.world_size,
            tp=j.tp,
            pp=j.pp,
            dp=j.dp,
            rank_order=j.rank_order,
            nodes=n,
            open_incidents=o,
            created_at=j.created_at,
            last_seen_at=j.last_seen_at,
        )
        for j, n, o in rows
    ]
    return JobListPage(items=items, next_cursor=next_cursor)


# --- one job -----------------------------------------------------------------------------------------------


def ranges(values: Iterable[int | None]) -> str:
    """'0-7, 16, 18-19': a set of small integers as an on-call engineer reads it."""
    ordered = sorted({v for v in values if v is not None})
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


@dataclass
class Placement:
    """One node of the job: its ranks and the parallel groups they serve."""

    node: str
    state: str
    lemon: bool
    ranks: list[int] = field(default_factory=list)
    local_ranks: list[int | None] = field(default_factory=list)
    gpus: list[int | None] = field(default_factory=list)
    tp_groups: set[int] = field(default_factory=set)
    pp_stages: set[int] = field(default_factory=set)
    dp_replicas: set[int] = field(default_factory=set)

    def text(self, attribute: str) -> str:
        """One of the lists above as ranges, e.g. `ranks` as '8-15'."""
        return ranges(getattr(self, attribute))


@dataclass
class GridCell:
    """A TP group (a PP stage of a DP replica), or the same stage of consecutive replicas held by the same
    nodes: the nodes holding its ranks, coloured by the worst one."""

    tp_groups: list[int]
    nodes: list[tuple[str, str]]  # (name, state)

    @property
    def label(self) -> str:
        return f"TP group{'s' if len(self.tp_groups) > 1 else ''} {ranges(self.tp_groups)}"

    @property
    def state(self) -> str | None:
        return min((s for _, s in self.nodes), key=lambda s: _STATE_RANK.get(s, 99), default=None)


@dataclass
class ParallelGrid:
    tp: int
    pp: int
    dp: int
    order: str
    rows: list[tuple[str, list[GridCell]]]  # (DP replicas, e.g. "0-7", one cell per PP stage)
    hidden_replicas: int


@dataclass
class CostlyIncident:
    id: int
    state: str
    severity: str
    root_cause: str
    blame: str
    summary: str | None
    opened_at: datetime
    resolved_at: datetime | None
    lost_s: float
    lost_recent_s: float


@dataclass
class ProgressView:
    """ETTR from the job's step lines (ml/ettr.py): the numbers, the plot, and the time each incident lost."""

    report: EttrReport
    plot: plots.RatioPlot | None
    losses: list[tuple[IncidentLoss, Incident]]  # most costly first, at most COSTLY_LIMIT
    more_losses: int

    @property
    def lost_by_incident(self) -> dict[int, float]:
        """Each incident's lost time from step progress: the one figure both of the page's tables show."""
        return {loss.id: loss.lost_s for loss in self.report.incidents}


@dataclass
class JobView:
    job: JobOut
    placements: list[Placement]
    grid: ParallelGrid | None
    total: Ettr
    recent: Ettr
    incidents: list[CostlyIncident]
    more_incidents: int
    merged: int
    unplaced_ranks: int
    progress: ProgressView
    sources: list[SignalSource] = field(default_factory=list)


def _layout(job: JobOut) -> tuple[JobInfo, parallel.Layout] | None:
    p = job.parallelism
    if p is None:
        return None
    info = JobInfo(job_id=job.job_id, world_size=job.world_size, tp=p.tp, pp=p.pp, dp=p.dp, order=p.order)
    return info, parallel.layout(info)


def placements(job: JobOut, *, states: dict[str, tuple[str, bool]]) -> tuple[list[Placement], ParallelGrid | None]:
    """Ranks grouped by node with the TP groups, PP stages and DP replicas each node serves, and the grid."""
    by_node: dict[str, Placement] = {}
    for name in sorted(states):
        state, lemon = states[name]
        by_node[name] = Placement(node=name, state=state, lemon=lemon)
    for r in job.ranks:
        p = by_node.setdefault(r.node, Placement(node=r.node, state="healthy", lemon=False))
        p.ranks.append(r.rank)
        p.local_ranks.append(r.local_rank)
        p.gpus.append(r.gpu)
    laid = _layout(job)
    if laid is None or not job.ranks:
        return list(by_node.values()), None
    info, lay = laid
    rank_ids = np.array([r.rank for r in job.ranks], dtype=np.int64)
    coords = parallel.coordinates_array(lay, rank_ids)
    # A TP group's number: its (DP replica, PP stage) in reading order of the grid.
    tp_group = coords["dp"] * lay.sizes["pp"] + coords["pp"]
    cells: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for i, r in enumerate(job.ranks):
        p = by_node[r.node]
        stage, replica = int(coords["pp"][i]), int(coords["dp"][i])
        p.tp_groups.add(int(tp_group[i]))
        p.pp_stages.add(stage)
        p.dp_replicas.add(replica)
        cells[(replica, stage)][r.node] = p.state
    replicas = max(lay.sizes["dp"], int(coords["dp"].max()) + 1)
    shown = min(replicas, GRID_MAX_REPLICAS)
    # Consecutive replicas on the same nodes share a row: a data-parallel job with 8 replicas a node reads
    # as one row a node rather than eight identical ones.
    merged: list[tuple[list[int], list[GridCell]]] = []
    for replica in range(shown):
        row = [
            GridCell(tp_groups=[replica * lay.sizes["pp"] + stage], nodes=sorted(cells[(replica, stage)].items()))
            for stage in range(lay.sizes["pp"])
        ]
        if merged and [c.nodes for c in merged[-1][1]] == [c.nodes for c in row]:
            merged[-1][0].append(replica)
            for kept, cell in zip(merged[-1][1], row, strict=True):
                kept.tp_groups.extend(cell.tp_groups)
        else:
            merged.append(([replica], row))
    grid = ParallelGrid(
        tp=lay.sizes["tp"],
        pp=lay.sizes["pp"],
        dp=lay.sizes["dp"],
        order=info.order,
        rows=[(ranges(replicas_of_row), row) for replicas_of_row, row in merged],
        hidden_replicas=replicas - shown,
    )
    return list(by_node.values()), grid


def _costs(
    job_incidents: Sequence[Incident], *, total: Interval, recent: Interval, now: datetime
) -> tuple[list[Interval], list[CostlyIncident], int]:
    lost: list[Interval] = []
    costly: list[CostlyIncident] = []
    merged = 0
    for i in job_incidents:
        if not counts_against_ettr(i.resolution):
            merged += 1
            continue
        interval = incident_interval(i.opened_at, i.resolved_at, now=now)
        lost.append(interval)
        costly.append(
            CostlyIncident(
                id=i.id,
                state=i.state,
                severity=i.severity,
                root_cause=i.root_cause,
                blame=i.blame,
                summary=i.summary,
                opened_at=i.opened_at,
                resolved_at=i.resolved_at,
                lost_s=covered_seconds([interval], start=total[0], end=total[1]),
                lost_recent_s=covered_seconds([interval], start=recent[0], end=recent[1]),
            )
        )
    costly.sort(key=lambda c: (-c.lost_s, -c.id))
    return lost, costly, merged


def job_view(session: Session, *, job_id: str, now: datetime) -> JobView:
    """Everything the job page shows, in eight queries whatever the number of ranks, nodes and incidents."""
    job = jobs.get_by_external_id(session, job_id=job_id)
    out = jobs.describe(session, job=job)
    places, grid = placements(out, states=jobs.node_states(session, job=job))
    job_incidents = incidents.of_job(session, job=job)
    total = job_window(job.created_at, job.last_seen_at, running=job.state == "running", now=now)
    recent = (max(total[0], total[1] - RECENT), total[1])
    lost, costly, merged = _costs(job_incidents, total=total, recent=recent, now=now)
    shown = [c for c in costly if c.lost_s > 0][:COSTLY_LIMIT]
    counted = {i.id: i for i in job_incidents if counts_against_ettr(i.resolution)}
    spans = [IncidentSpan(i.id, i.opened_at, i.resolved_at) for i in counted.values()]
    report = step_ettr.job_ettr(session, job=job, now=now, incidents=spans)
    losses = sorted(report.incidents, key=lambda loss: (-loss.lost_s, -loss.id))
    progress = ProgressView(
        report=report,
        plot=plots.ratio_plot([(p.ts, p.cumulative, p.window) for p in report.series]),
        losses=[(loss, counted[loss.id]) for loss in losses[:COSTLY_LIMIT]],
        more_losses=max(0, len(losses) - COSTLY_LIMIT),
    )
    return JobView(
        job=out,
        placements=places,
        grid=grid,
        total=ettr(lost, start=total[0], end=total[1]),
        recent=ettr(lost, start=recent[0], end=recent[1]),
        incidents=shown,
        more_incidents=sum(c.lost_s > 0 for c in costly) - len(shown),
        merged=merged,
        unplaced_ranks=max(0, (out.world_size or 0) - len(out.ranks)),
        progress=progress,
        sources=job_signal_sources(session, job=job),
    )
