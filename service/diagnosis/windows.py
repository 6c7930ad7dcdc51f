"""Window aggregates of a job's GPU samples: built once, in SQL, as windows close; read by the detectors.

Each pass rolls up the windows of its job that closed since the job's cursor (one INSERT ... SELECT ...
GROUP BY over the new samples only), so the cost of a pass does not grow with how long the job has run. A
window [t, t + WINDOW_S) closes `window_grace_s` after its end, which leaves agents that ship every few
seconds time to deliver its samples; a sample that arrives later still than that stays in the samples
(plots, evidence: `gpu_samples`) but not in its window.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ml.metrics import METRIC_COLUMNS, WINDOW_MAX_COLUMNS, WINDOW_S
from ml.node_metrics import NODE_COUNTERS, NODE_GAUGES
from ml.windows import floor_time
from service.config import Settings
from service.diagnosis import frames, state
from service.models import Job, Node, job_columns

DETECTOR = "windows"
NODE_DETECTOR = "node_windows"
# Passes come every 5 s (the beat) and windows close every 10 s, so each window is met by two passes. The heavy
# stages are spread over both: the GPU windows are built 6 s after their end (window_grace_s), the peers compare
# them a pass later, with the node windows of the window after built and judged 1 s after its end
# (node_window_grace_s) (each pair takes about a second at 16,384 GPUs; one pass doing three of the four went over
# the 2 s budget). The peers of a job that large read what closed JUDGE_LAG_S before (`judge_lag_s`).
JUDGE_LAG_S = 5.0
VERSION = 1
_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # date_bin's origin: windows aligned on the epoch's 10 s marks


def _rollup_sql(source: str, target: str, unit: str, means: Collection[str], peaks: Collection[str]) -> str:
    """INSERT ... SELECT of `source`'s rows into `target`'s windows, per job, node and `unit` (gpu, subject)."""
    columns = "".join(f", {c}" for c in [*means, *(f"{c}_max" for c in peaks)])
    aggregates = "".join(f", {a}" for a in [*(f"avg({c})" for c in means), *(f"max({c})" for c in peaks)])
    return (
        f"INSERT INTO {target} (job_id, window_start, node_id, {unit}, n, last_ts{columns}) "
        f"SELECT job_id, date_bin(make_interval(secs => {WINDOW_S}), ts, :origin) AS window_start, node_id, {unit}, "
        f"count(*), max(ts){aggregates} "
        f"FROM {source} WHERE job_id = :job AND ts >= :lo AND ts < :hi "
        f"GROUP BY job_id, window_start, node_id, {unit} "
        "ON CONFLICT DO NOTHING"
    )


# source (job_columns) -> (samples table, windows table, unit, mean columns, maximum columns)
_ROLLUPS: dict[str, tuple[str, str, str, tuple[str, ...], tuple[str, ...]]] = {
    # GPU samples through gpu_samples(lo, hi) (service/maintenance/compaction.py): the hot rows and, for a pass
    # catching up on an hour already compacted, the chunks.
    "gpu": ("gpu_samples(:lo, :hi)", "metric_windows", "gpu", tuple(METRIC_COLUMNS), WINDOW_MAX_COLUMNS),
    "node": ("node_samples", "node_windows", "subject", tuple(NODE_GAUGES), tuple(NODE_COUNTERS)),
}


@functools.lru_cache(maxsize=256)
def _statement(source: str, reported: frozenset[str]) -> Any:
    """The rollup of the columns a job's agents report; of every column where none is recorded (rows written
    by something other than ingest, or before job_columns existed). The others stay NULL, as they would."""
    samples, target, unit, means, peaks = _ROLLUPS[source]
    if reported:
        means = tuple(c for c in means if c in reported)
        peaks = tuple(c for c in peaks if c in reported)
    return text(_rollup_sql(samples, target, unit, means, peaks))


def reported_columns(session: Session, *, job_id: int, source: str) -> frozenset[str]:
    """The columns of `source` ("gpu", "node") that the job's agents have reported (ingest records them)."""
    query = select(job_columns.c.name).where(job_columns.c.job_id == job_id, job_columns.c.source == source)
    return frozenset(session.scalars(query))


def rollup(session: Session, *, job: Job, now: datetime, grace_s: float, lookback_s: float) -> datetime:
    """Build the job's GPU windows that closed since its cursor (at most `lookback_s` back); returns the end of
    the closed windows, up to which detectors may read."""
    return _rollup(session, "gpu", DETECTOR, job=job, now=now, grace_s=grace_s, lookback_s=lookback_s)


def rollup_nodes(session: Session, *, job: Job, now: datetime, grace_s: float, lookback_s: float) -> datetime:
    """The same for the node windows (ports, hosts, volumes)."""
    return _rollup(session, "node", NODE_DETECTOR, job=job, now=now, grace_s=grace_s, lookback_s=lookback_s)


def judge_lag_s(gpus: int, *, min_gpus: int) -> float:
    """How long after its windows close a job's peers are compared: JUDGE_LAG_S for a job of `min_gpus` GPUs or more
    (its rollup and its peer comparison in separate passes), at once for a smaller one."""
    return JUDGE_LAG_S if gpus >= min_gpus else 0.0


def peers_judged(closed: datetime, *, now: datetime, gpus: int, settings: Settings) -> datetime:
    """The end of the GPU windows a pass's peer comparison judges, of those closed by `closed`: one rule for a single
    pass and for a split pass's plan, whose groups and merge must judge the same spans."""
    lag = judge_lag_s(gpus, min_gpus=settings.diagnosis_judge_lag_min_gpus)
    return min(closed, closed_at(now, grace_s=settings.window_grace_s, lag_s=lag))


def closed_at(now: datetime, *, grace_s: float, lag_s: float = 0.0) -> datetime:
    """The end of the windows closed at `now` for a stage `lag_s` behind the GPU windows."""
    return floor_time(now - timedelta(seconds=grace_s + lag_s))


def _rollup(
    session: Session, source: str, detector: str, *, job: Job, now: datetime, grace_s: float, lookback_s: float
) -> datetime:
    closed = closed_at(now, grace_s=grace_s)
    cursor, _ = state.load(session, job_id=job.id, detector=detector, version=VERSION)
    start = closed - timedelta(seconds=lookback_s)
    if cursor is not None and cursor > start:
        start = cursor
    if start < closed:
        statement = _statement(source, reported_columns(session, job_id=job.id, source=source))
        session.execute(statement, {"job": job.id, "lo": start, "hi": closed, "origin": _ORIGIN})
        state.save(session, job_id=job.id, detector=detector, version=VERSION, cursor=closed, state={}, now=now)
    return closed


def node_names(session: Session, *, node_ids: list[int]) -> dict[int, str]:
    return {node_id: name for node_id, name in session.execute(select(Node.id, Node.name).where(Node.id.in_(node_ids)))}


def read(
    session: Session,
    *,
    job: Job,
    start: datetime,
    end: datetime,
    columns: list[str],
    names: dict[int, str],
    node_ids: list[int] | None = None,
) -> pd.DataFrame:
    """The job's GPU window rows with window_start in [start, end) as ml/windows.py frames them, with node names
    (from `names`, which learns the ones it lacked)."""
    wanted = [c for c in dict.fromkeys(columns) if c in _STORED]
    return _read(
        "metric_windows", "gpu", wanted, session, job=job, start=start, end=end, names=names, node_ids=node_ids
    )


def read_nodes(
    session: Session,
    *,
    job: Job,
    start: datetime,
    end: datetime,
    columns: list[str],
    names: dict[int, str],
    node_ids: list[int] | None = None,
) -> pd.DataFrame:
    """The job's node window rows (ports, host, volumes: one per subject) with window_start in [start, end)."""
    wanted = [c for c in dict.fromkeys(columns) if c in NODE_STORED]
    return _read(
        "node_windows", "subject", wanted, session, job=job, start=start, end=end, names=names, node_ids=node_ids
    )


def _read(
    table: str,
    unit: str,
    wanted: list[str],
    session: Session,
    *,
    job: Job,
    start: datetime,
    end: datetime,
    names: dict[int, str],
    node_ids: list[int] | None,
) -> pd.DataFrame:
    where = "job_id = %(job)s AND window_start >= %(start)s AND window_start < %(end)s"
    params: dict[str, Any] = {"job": job.id, "start": start, "end": end}
    if node_ids is not None:
        where += " AND node_id = ANY(%(nodes)s)"
        params["nodes"] = node_ids
    selected = ["window_start", "node_id", unit, "n", "last_ts", *wanted]
    frame = frames.copy_frame(
        session,
        f"SELECT {', '.join(selected)} FROM {table} WHERE {where}",
        params,
        columns=selected,
        floats=wanted,
        times=("window_start", "last_ts"),
    )
    # Nodes that report for the job without a rank on it yet (a late join) are named too; `names` keeps them.
    missing = {int(i) for i in frame["node_id"].unique()} - names.keys()
    if missing:
        names.update(node_names(session, node_ids=sorted(missing)))
    frame["node"] = frame["node_id"].map(names)
    return frame.dropna(subset=["node"]).drop(columns=["node_id"])


_STORED = frozenset([*METRIC_COLUMNS, *(f"{c}_max" for c in WINDOW_MAX_COLUMNS)])
NODE_STORED = frozenset([*NODE_GAUGES, *(f"{c}_max" for c in NODE_COUNTERS)])
