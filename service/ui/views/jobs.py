"""Jobs: the list, and one job's ranks on nodes, its parallel groups, and the training time incidents cost it.

ETTR (effective training time ratio) = productive time / wall time: from the job's step lines when it logs them
(ml/ettr.py), else estimated from its incidents' open time (the union of their intervals, opened -> resolved or now,
clipped to the job's life or its last hour: two incidents open at once lose that time once). Either way the cost
table (service/jobs/costs.py) charges each stall once, to the incident that caused it, and its total is the job's
lost time, wall x (1 - ETTR). Merged-away incidents (resolution "merged...") are duplicates of another and do not
count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy.orm import Session

from ml import parallel
from ml.ettr import EttrReport, IncidentSpan
from ml.findings import JobInfo
from service.jobs import costs as job_costs
from service.jobs import ettr as step_ettr
from service.jobs import service as jobs
from service.jobs.costs import Ettr, ettr, incident_interval, job_window
from service.jobs.schemas import JobOut
from service.jobs.signal_sources import SignalSource, job_signal_sources
from service.nodes import returns
from service.nodes.returns import BeforeGate
from service.ui import plots

RECENT = timedelta(hours=1)
# A grid taller than this is cut: past a few hundred DP replicas nobody reads cells, they filter by node.
GRID_MAX_REPLICAS = 512
# Worst first: the colour of a grid cell is its worst node's state.
_STATE_RANK = {s: i for i, s in enumerate(("evicted", "in_repair", "cordoned", "suspect", "returning", "healthy"))}
counts_against_ettr = step_ettr.counts_against_ettr


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
class ProgressView:
    """ETTR from the job's step lines (ml/ettr.py): the numbers and the plot."""

    report: EttrReport
    plot: plots.RatioPlot | None


@dataclass
class JobView:
    job: JobOut
    placements: list[Placement]
    grid: ParallelGrid | None
    total: Ettr  # estimated from incidents' open time: the ETTR before any step line
    recent: Ettr
    costs: job_costs.CostTable  # what each incident cost, each stall charged once; its total is the ETTR's lost time
    merged: int
    unplaced_ranks: int
    progress: ProgressView
    sources: list[SignalSource] = field(default_factory=list)
    before_gate: list[BeforeGate] = field(default_factory=list)  # its nodes a scheduler placed before their gate


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


def job_view(session: Session, *, job_id: str, now: datetime) -> JobView:
    """Everything the job page shows, in a fixed number of queries whatever the number of ranks, nodes and incidents."""
    job = jobs.get_by_external_id(session, job_id=job_id)
    out = jobs.describe(session, job=job)
    places, grid = placements(out, states=jobs.node_states(session, job=job))
    job_incidents = job_costs.job_incidents(session, job=job)
    total = job_window(job.created_at, job.last_seen_at, running=job.state == "running", now=now)
    recent = (max(total[0], total[1] - RECENT), total[1])
    counted = [i for i in job_incidents if counts_against_ettr(i.resolution)]
    lost = [incident_interval(i.opened_at, i.resolved_at, now=now) for i in counted]
    spans = [IncidentSpan(i.id, i.opened_at, i.resolved_at) for i in counted]
    report = step_ettr.job_ettr(session, job=job, now=now, incidents=spans)
    estimate = ettr(lost, start=total[0], end=total[1])
    return JobView(
        job=out,
        placements=places,
        grid=grid,
        total=estimate,
        recent=ettr(lost, start=recent[0], end=recent[1]),
        costs=job_costs.cost_table(job_incidents, report=report, estimate=estimate),
        merged=len(job_incidents) - len(counted),
        unplaced_ranks=max(0, (out.world_size or 0) - len(out.ranks)),
        progress=ProgressView(
            report=report, plot=plots.ratio_plot([(p.ts, p.cumulative, p.window) for p in report.series])
        ),
        sources=job_signal_sources(session, job=job),
        before_gate=returns.before_gate(session, job_id=job.id),
    )
