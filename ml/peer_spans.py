"""Peer comparison's sub-window summaries (ml/peers.py reads them): per metric, every GPU's robust distance
from its peers over one span, and the outliers standing apart with a clear gap."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from ml import parallel
from ml.findings import JobInfo
from ml.metrics import (
    DRAM_ACTIVE,
    GPU_TEMP,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MEM_COPY_UTIL,
    MEMORY_TEMP,
    NVLINK_BANDWIDTH_TOTAL,
    NVLINK_RX_BYTES,
    NVLINK_TX_BYTES,
    PCIE_RX_BYTES,
    PCIE_TX_BYTES,
    POWER_LIMIT,
    POWER_USAGE,
    SM_ACTIVE,
    SM_CLOCK,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    WINDOW_S,
)

# Minder found network, CPU, GPU power, duty cycle, tensor activity and NVLink bandwidth the most telling;
# DCGM has no network or CPU counters, so GPU power leads. Earlier metrics lead a finding's evidence.
DEFAULT_PRIORITY: tuple[str, ...] = (
    POWER_USAGE,
    GPU_UTIL,
    TENSOR_ACTIVE,
    NVLINK_TX_BYTES,
    NVLINK_RX_BYTES,
    NVLINK_BANDWIDTH_TOTAL,
    SM_ACTIVE,
    SM_CLOCK,
    DRAM_ACTIVE,
    GPU_TEMP,
    PCIE_TX_BYTES,
    PCIE_RX_BYTES,
)

Z_MIN = 4.0  # distance from the centre, in robust scale units, to be an outlier
GAP_MIN = 2.0  # an outlier must stand this far from the nearest inlier (a clear gap)
MAX_OUTLIER_FRACTION = 0.25  # more outliers than this is a split job, not a bad machine
MIN_UNITS = 3
MIN_SAMPLE_FRACTION = 0.3  # of the window's typical sample count a unit needs to be summarized
SUPPORT_Z = 2.0  # a supporting metric stays at least this far out in every window (ml/peers.py)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How to read one metric: what an outlier on it means and how little a difference counts."""

    category: str
    rel_floor: float  # scale never below this fraction of the centre
    abs_floor: float  # ... nor below this many units of the metric
    weight: float  # how much a suspect on this metric alone is worth (0..1)
    counter: bool = False  # may arrive cumulative: differenced when it only ever grows


SPECS: dict[str, MetricSpec] = {
    POWER_USAGE: MetricSpec("straggler", 0.05, 10.0, 0.6),
    GPU_UTIL: MetricSpec("straggler", 0.05, 5.0, 0.45),
    TENSOR_ACTIVE: MetricSpec("straggler", 0.05, 0.02, 0.55),
    SM_ACTIVE: MetricSpec("straggler", 0.05, 0.02, 0.5),
    GR_ENGINE_ACTIVE: MetricSpec("straggler", 0.05, 0.02, 0.45),
    SM_OCCUPANCY: MetricSpec("straggler", 0.05, 0.02, 0.35),
    DRAM_ACTIVE: MetricSpec("straggler", 0.05, 0.02, 0.4),
    SM_CLOCK: MetricSpec("straggler", 0.05, 30.0, 0.55),
    MEM_COPY_UTIL: MetricSpec("straggler", 0.05, 5.0, 0.35),
    # Slot position and airflow make temperatures differ more than anything else: a wider floor.
    GPU_TEMP: MetricSpec("straggler", 0.08, 3.0, 0.3),
    MEMORY_TEMP: MetricSpec("straggler", 0.08, 3.0, 0.25),
    NVLINK_TX_BYTES: MetricSpec("nvlink", 0.05, 1e6, 0.5, counter=True),
    NVLINK_RX_BYTES: MetricSpec("nvlink", 0.05, 1e6, 0.5, counter=True),
    NVLINK_BANDWIDTH_TOTAL: MetricSpec("nvlink", 0.05, 1e3, 0.45, counter=True),
    PCIE_TX_BYTES: MetricSpec("pcie", 0.05, 1e6, 0.35, counter=True),
    PCIE_RX_BYTES: MetricSpec("pcie", 0.05, 1e6, 0.35, counter=True),
}

# Power over its limit: derived per window row, not a stored column.
_POWER_RATIO = "power_ratio"
# Whether the job is working in a window: the first of these with data, and the job-wide median it needs.
# Utilization comes last: a rank spinning in a hung NCCL collective reads 100%.
_ACTIVITY = ((SM_ACTIVE, 0.1), (TENSOR_ACTIVE, 0.02), (_POWER_RATIO, 0.25), (GPU_UTIL, 10.0))


SPAN_S = 30.0  # one sub-window of the comparison: three 10 s windows


def summarize_span(
    job: JobInfo,
    rolled: pd.DataFrame,
    *,
    end: datetime,
    span_s: float = SPAN_S,
    metrics_priority: Sequence[str] = DEFAULT_PRIORITY,
) -> dict[str, Any]:
    """One sub-window ending at `end`, from window rows (ml/windows.py): whether the job was working, whether it
    worked through every window of it (steady), and per metric every GPU's distance from its peers (only the large
    ones, |z| >= SUPPORT_Z) and the outliers. Plain JSON, so a service can keep it between passes."""
    part = span_part(job, rolled, end=end, span_s=span_s, metrics_priority=metrics_priority)
    judged = judge_span(job, [part], span_s=span_s, metrics_priority=metrics_priority)
    assert judged is not None  # one part always agrees with itself on the gauge
    return judged


@dataclass(slots=True)
class MetricPart:
    """One metric of a span part, per busy GPU: its mean (windows weighted by samples) and, for a counter read
    cumulatively, its per-second rise; whether a counter is cumulative is decided job-wide from the counts."""

    mean: np.ndarray
    mean_counts: np.ndarray
    rate: np.ndarray | None = None
    rate_counts: np.ndarray | None = None
    rises: tuple[int, int, int] = (0, 0, 0)  # consecutive differences: all, >= 0, > 0


@dataclass(slots=True)
class SpanPart:
    """What one set of GPUs (a node group) contributes to a span's summary. Everything the summary compares across
    GPUs (medians, spreads, the activity gauge's choice) is left to `judge_span`, so the parts of disjoint node
    groups give the same summary as one part of all their GPUs: a diagnosis pass can be split across workers."""

    rows: int = 0  # in-span window rows
    notna: dict[str, int] = field(default_factory=dict)  # per activity gauge candidate: in-span rows with a value
    gauge: str | None = None  # the gauge this part's per-GPU figures used (its own choice: judge_span checks it)
    window_starts: list[int] = field(default_factory=list)  # in-span window starts, epoch seconds
    unit_gauge: np.ndarray = field(default_factory=lambda: np.empty(0))  # per in-span GPU: its median gauge
    window_of: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # per (window, GPU) ...
    window_gauge: np.ndarray = field(default_factory=lambda: np.empty(0))  # ... the GPU's median gauge there
    units: list[str] = field(default_factory=list)  # busy GPUs, sorted
    counts: np.ndarray = field(default_factory=lambda: np.empty(0))  # per busy GPU: its samples in the span
    metrics: dict[str, MetricPart] = field(default_factory=dict)


def span_part(
    job: JobInfo,
    rolled: pd.DataFrame,
    *,
    end: datetime,
    span_s: float = SPAN_S,
    metrics_priority: Sequence[str] = DEFAULT_PRIORITY,
) -> SpanPart:
    """The per-GPU half of `summarize_span` over these window rows (all of a job's, or one node group's)."""
    part = SpanPart()
    frame = _span_frame(job, rolled, _utc(end), span_s)
    if frame is None:
        return part
    in_span = frame[~frame["previous"]]
    part.rows = len(in_span)
    if in_span.empty:
        return part
    for column, _ in _ACTIVITY:
        if column in in_span.columns:
            part.notna[column] = int(_numeric(in_span[column]).notna().sum())
    gauge = _activity(in_span)
    starts = pd.to_datetime(in_span["window_start"], utc=True)
    part.window_starts = sorted({int(t.timestamp()) for t in starts.unique()})
    if gauge is not None:
        values, _ = gauge
        part.gauge = _chosen(in_span)  # the column `gauge` read
        part.unit_gauge = values.groupby(in_span["unit"]).median().to_numpy(dtype=float)
        per = values.groupby([starts, in_span["unit"]]).median()
        since_epoch = per.index.get_level_values(0) - pd.Timestamp(0, tz="UTC")
        part.window_of = np.asarray(since_epoch // pd.Timedelta(seconds=1), dtype=np.int64)
        part.window_gauge = per.to_numpy(dtype=float)
    frame = frame[frame["unit"].isin(_busy_units(in_span, gauge))]
    units, uid = np.unique(frame["unit"].to_numpy(), return_inverse=True)
    part.units = [str(u) for u in units.tolist()]
    # Each GPU's samples in the span, whatever the metric.
    part.counts = np.bincount(
        uid, weights=np.where(frame["previous"], 0, frame["n"].to_numpy(dtype=float)), minlength=len(units)
    )
    for metric in dict.fromkeys(metrics_priority):
        if metric in frame.columns:
            part.metrics[metric] = _metric_part(frame, units, uid, part.counts, metric, _spec(metric))
    return part


def _chosen(frame: pd.DataFrame) -> str | None:
    """The activity gauge `_activity` picks for these rows."""
    for column, _ in _ACTIVITY:
        if column in frame.columns and _numeric(frame[column]).notna().mean() >= 0.5:
            return column
    return None


def judge_span(
    job: JobInfo,
    parts: Sequence[SpanPart],
    *,
    span_s: float = SPAN_S,
    metrics_priority: Sequence[str] = DEFAULT_PRIORITY,
) -> dict[str, Any] | None:
    """The span's summary from the parts of disjoint node groups: the job-wide comparisons on their per-GPU
    figures. None when a part's gauge is not the one the whole job's rows pick (a part must then be redone with
    it: in practice the gauge columns are reported by every node or by none)."""
    result: dict[str, Any] = {"active": False, "steady": False, "metrics": {}}
    parts = [p for p in parts if p.rows]
    if not parts:
        return result
    rows = sum(p.rows for p in parts)
    gauge = next(
        (c for c, _ in _ACTIVITY if c in parts[0].notna and sum(p.notna.get(c, 0) for p in parts) / rows >= 0.5),
        None,
    )
    if any(p.gauge != gauge for p in parts):
        return None
    if gauge is not None:
        threshold = dict(_ACTIVITY)[gauge]
        active = bool(pd.Series(np.concatenate([p.unit_gauge for p in parts])).median() >= threshold)
    else:
        active = True
    result["active"] = active
    if not active:
        return result
    windows = round(span_s / WINDOW_S)
    if len({w for p in parts for w in p.window_starts}) < windows:
        result["steady"] = False
    elif gauge is None:
        result["steady"] = True
    else:
        per = pd.Series(np.concatenate([p.window_gauge for p in parts]))
        per_window = per.groupby(np.concatenate([p.window_of for p in parts])).median()
        result["steady"] = bool((per_window >= dict(_ACTIVITY)[gauge]).all())
    # Units of disjoint node groups, in the order one part of them all would have (sorted).
    names = np.array([u for p in parts for u in p.units], dtype=object)
    order = np.argsort(names, kind="stable")
    units = names[order]
    stages = _pipeline_stages(job, units)
    groups = np.array([stages.get(u, -1) for u in units])
    for metric in dict.fromkeys(metrics_priority):
        pieces = [p.metrics.get(metric) for p in parts]
        if any(m is None for m in pieces):
            continue
        spec = _spec(metric)
        summaries = _merged_summaries(units, order, [m for m in pieces if m is not None])
        if summaries is None:
            continue
        zs, out = _grouped_outliers(summaries, 0, spec, groups)
        result["metrics"][metric] = {
            "z": {u: round(z, 3) for u, z in zs.items() if abs(z) >= SUPPORT_Z},
            "out": out,
        }
    return result


def _merged_summaries(units: np.ndarray, order: np.ndarray, pieces: list[MetricPart]) -> Summaries | None:
    """A metric's per-GPU summaries over every part, read cumulatively when the job's counter rows say so."""
    total, nonneg, pos = (sum(m.rises[i] for m in pieces) for i in range(3))
    cumulative = (
        all(m.rate is not None for m in pieces) and total >= 3 and nonneg / total >= 0.95 and pos / total >= 0.5
    )
    if cumulative:
        values = np.concatenate([m.rate for m in pieces if m.rate is not None])
        counts = np.concatenate([m.rate_counts for m in pieces if m.rate_counts is not None])
    else:
        values = np.concatenate([m.mean for m in pieces])
        counts = np.concatenate([m.mean_counts for m in pieces])
    return _summaries(units, values[order], counts[order])


# --- input ---


def _numeric(values: pd.Series) -> pd.Series:
    """Floats from whatever the column holds (strings, booleans, None): unreadable values become NaN."""
    return pd.to_numeric(values, errors="coerce").astype("float64")


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _span_frame(job: JobInfo, rolled: pd.DataFrame, end: datetime, span_s: float) -> pd.DataFrame | None:
    """The span's window rows (and, flagged `previous`, the window before it, which a counter's first
    difference needs) of the job's GPUs, with a unit ("node/gpu")."""
    if not isinstance(rolled, pd.DataFrame) or rolled.empty:
        return None
    starts = pd.to_datetime(rolled["window_start"], utc=True)
    begin = pd.Timestamp(end) - pd.Timedelta(seconds=span_s)
    frame = rolled[(starts >= begin - pd.Timedelta(seconds=WINDOW_S)) & (starts < pd.Timestamp(end))].copy()
    nodes = set(job.nodes)
    if nodes and frame["node"].isin(nodes).any():
        frame = frame[frame["node"].isin(nodes)]  # GPUs of other jobs are no peers
    if frame.empty:
        return None
    frame["previous"] = pd.to_datetime(frame["window_start"], utc=True) < begin
    if "unit" not in frame.columns:  # a caller summarizing many spans of one frame names the units once
        frame["unit"] = unit_names(frame)
    if POWER_USAGE in frame.columns and POWER_LIMIT in frame.columns:
        limit = _numeric(frame[POWER_LIMIT])
        frame[_POWER_RATIO] = _numeric(frame[POWER_USAGE]) / limit.where(limit > 0)
    return frame.sort_values(["unit", "window_start"])


def unit_names(frame: pd.DataFrame) -> pd.Series:
    """Each window row's GPU as "node/gpu", the unit the comparison is made between."""
    return frame["node"].astype(str) + "/" + frame["gpu"].astype(int).astype(str)


def _pipeline_stages(job: JobInfo, units: Any) -> dict[str, int]:
    """Each GPU's pipeline stage, when the job has several: stages run different layers (the first embeds,
    the last computes the loss) and are only peers among themselves. A node's GPU i runs its i-th rank
    (torchrun's local rank); GPUs that cannot be placed share stage -1."""
    if max(1, int(job.pp or 1)) <= 1 or not job.rank_nodes:
        return {}
    by_node: dict[str, list[int]] = {}
    for rank, node in job.rank_nodes.items():
        by_node.setdefault(str(node), []).append(int(rank))
    placed: dict[str, int] = {}
    for unit in units:
        node, _, gpu = str(unit).rpartition("/")
        ranks = sorted(by_node.get(node, []))
        if gpu.isdigit() and int(gpu) < len(ranks):
            placed[str(unit)] = ranks[int(gpu)]
    if not placed:
        return {}
    stage = parallel.coordinates_array(job, np.array(list(placed.values())))["pp"]
    return {u: int(s) for u, s in zip(placed, stage, strict=True)}


# How busy a GPU is. In synchronous training the slow GPU works longest and its peers wait for it; a GPU less busy
# than its peers waited for its own input (a data loader starved of CPU, slow storage): its machine's host side is
# the suspect, not the GPU, and its clock and power drop as any idle GPU's do.
BUSY_METRICS = frozenset({"gpu_util", "sm_active", "tensor_active"})


# Data moved per second over NVLink and PCIe: a GPU moving MORE than its peers is no fault's sign (a faulty link
# or a slow GPU moves less, or its peers wait); a restart's reload or a loader's burst does it on healthy machines.
THROUGHPUT_METRICS = frozenset({NVLINK_TX_BYTES, NVLINK_RX_BYTES, NVLINK_BANDWIDTH_TOTAL, PCIE_TX_BYTES, PCIE_RX_BYTES})


# A GPU hotter than its peers: a victim of another machine's fault waits, idle and cooler, so this is the GPU's own
# state (its cooling, its power), whatever happened elsewhere.
HEAT_METRICS = frozenset({GPU_TEMP, MEMORY_TEMP})


def overheated(metric_sides: Iterable[tuple[str, str]]) -> bool:
    """Whether any of these (metric, side) is a temperature on the high side."""
    return any(metric in HEAT_METRICS and side == "high" for metric, side in metric_sides)


def busier(metric_sides: Iterable[tuple[str, str]]) -> bool:
    """Whether every one of these (metric, side) is a throughput metric on the high side."""
    sides = list(metric_sides)
    return bool(sides) and all(metric in THROUGHPUT_METRICS and side == "high" for metric, side in sides)


def working_harder(metric_sides: Iterable[tuple[str, str]]) -> bool:
    """Whether any of these (metric, side) is a busy metric on the high side: the GPU works longest each step."""
    return any(metric in BUSY_METRICS and side == "high" for metric, side in metric_sides)


def starved(metric_sides: Iterable[tuple[str, str]]) -> bool:
    """Whether any of these (metric, side) is a busy metric on the low side."""
    return any(metric in BUSY_METRICS and side == "low" for metric, side in metric_sides)


def strength(score: float) -> float:
    """How much of a metric's weight an outlier score earns: 0.7 at the threshold Z_MIN, all of it at 3 x Z_MIN
    (the continuity and recurrence rules weigh their metrics alike)."""
    return 0.7 + 0.3 * min(1.0, max(0.0, (score - Z_MIN) / (2 * Z_MIN)))


def _spec(metric: str) -> MetricSpec:
    """The spec of a known metric; a guess from the name for one the service added later."""
    if metric in SPECS:
        return SPECS[metric]
    low = metric.lower()
    category = "network" if low.startswith(("ib_", "net", "rdma", "pfc", "roce")) else "straggler"
    return MetricSpec(category, 0.05, 0.0, 0.4, counter=low.endswith(("_bytes", "_packets", "_total")))


# The activity gauge's values per row and the threshold a working GPU reaches; None when nothing tells.
Gauge = tuple[pd.Series, float] | None


def _activity(frame: pd.DataFrame) -> Gauge:
    """The activity gauge to judge idleness by (the first of _ACTIVITY with data) and its threshold."""
    column = _chosen(frame)
    return None if column is None else (_numeric(frame[column]), dict(_ACTIVITY)[column])


def _busy_units(frame: pd.DataFrame, gauge: Gauge) -> list[str]:
    """GPUs idle through the span while the job works are not in this job (a half-used node)."""
    if gauge is None:
        return list(frame["unit"].unique())
    values, threshold = gauge
    busy = values.groupby(frame["unit"]).max() >= threshold
    return list(busy[busy].index)


# --- per metric ---


@dataclass(frozen=True, slots=True)
class Summaries:
    """Per unit (rows) and window (columns): a metric's trimmed mean and how many samples made it."""

    units: list[str]
    values: np.ndarray
    counts: np.ndarray


def _metric_part(
    frame: pd.DataFrame, units: np.ndarray, uid: np.ndarray, counts: np.ndarray, metric: str, spec: MetricSpec
) -> MetricPart:
    """Per GPU over the span: the metric's mean (windows weighted by their samples), and for a counter its
    per-second increase from the window before the span to the span's last window, with the consecutive
    differences' signs that decide job-wide whether it only grows. `uid` codes each row's unit into `units`."""
    v = _numeric(frame[metric]).to_numpy(dtype=float)
    weight = np.where(frame["previous"] | ~np.isfinite(v), 0.0, frame["n"].to_numpy(dtype=float))
    total = np.bincount(uid, weights=weight, minlength=len(units))
    sums = np.bincount(uid, weights=np.where(weight > 0, v, 0.0) * weight, minlength=len(units))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(total > 0, sums / total, np.nan)
    part = MetricPart(means, np.where(total > 0, counts, 0))
    peak = f"{metric}_max"
    if spec.counter and peak in frame.columns:
        top = _numeric(frame[peak]).to_numpy(dtype=float)
        dv, same = _same_unit_diff(uid, top)
        dv = dv[same & np.isfinite(dv)]
        part.rises = (int(dv.size), int(np.count_nonzero(dv >= 0)), int(np.count_nonzero(dv > 0)))
        ts = (pd.to_datetime(frame["last_ts"], utc=True) - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
        ok = np.isfinite(top)  # rows are sorted by unit and time
        u, v, t = uid[ok], top[ok], ts[ok]
        present, head = np.unique(u, return_index=True)
        tail = len(u) - 1 - np.unique(u[::-1], return_index=True)[1]
        first, last, t0, t1 = (np.full(len(units), np.nan) for _ in range(4))
        first[present], t0[present] = v[head], t[head]
        last[present], t1[present] = v[tail], t[tail]
        dt = t1 - t0
        with np.errstate(invalid="ignore", divide="ignore"):
            part.rate = np.where((dt > 0) & (last >= first), (last - first) / dt, np.nan)
        part.rate_counts = counts
    return part


def _summaries(units: np.ndarray, values: np.ndarray, counts: np.ndarray) -> Summaries | None:
    if not np.isfinite(values).any():
        return None
    names = units.tolist() if units.dtype == object else [str(u) for u in units]  # object: already str
    return Summaries(names, values.reshape(-1, 1), counts.astype(float).reshape(-1, 1))


def _same_unit_diff(uid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive differences of x (rows sorted by unit and time), and where both rows are one unit's."""
    return np.diff(x), uid[1:] == uid[:-1]


def _grouped_outliers(
    s: Summaries, w: int, spec: MetricSpec, groups: np.ndarray
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """`_outliers` within each peer group (pipeline stage), merged."""
    zs: dict[str, float] = {}
    out: dict[str, dict[str, Any]] = {}
    for g in np.unique(groups):
        z, o = _outliers(s, w, spec, groups == g)
        zs.update(z)
        out.update(o)
    return zs, out


def _outliers(
    s: Summaries, w: int, spec: MetricSpec, members: np.ndarray
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Members' normalized distances in window `w` (those at least SUPPORT_Z: the only ones a summary keeps), and
    the members far from the rest of their peers (with their distance and the peers' band)."""
    x, count = s.values[:, w], np.where(members, s.counts[:, w], 0)
    present = count[count > 0]
    if present.size < MIN_UNITS:
        return {}, {}
    idx = np.flatnonzero((count >= max(2.0, MIN_SAMPLE_FRACTION * float(np.median(present)))) & np.isfinite(x))
    if idx.size < MIN_UNITS:
        return {}, {}
    x = x[idx]
    center = float(np.median(x))
    mad = float(np.median(np.abs(x - center))) * 1.4826
    scale = max(mad, spec.rel_floor * abs(center), spec.abs_floor, 1e-12)
    z = (x - center) / scale
    # Only the large distances become a dict: one entry per GPU and metric was most of a 16k-GPU span's time.
    far = np.flatnonzero(np.abs(z) >= SUPPORT_Z)
    zs = {s.units[idx[j]]: float(z[j]) for j in far}
    flagged = np.flatnonzero(np.abs(z) >= Z_MIN)
    if flagged.size == 0 or flagged.size > max(1, math.floor(MAX_OUTLIER_FRACTION * x.size)):
        return zs, {}
    inliers = np.delete(z, flagged)
    out: dict[str, dict[str, Any]] = {}
    for i in flagged:
        if np.min(np.abs(inliers - z[i])) < GAP_MIN:
            continue  # no clear gap: the tail of the noise
        peers, peer_z = np.delete(x, i), np.delete(z, i)
        out[s.units[idx[i]]] = {
            "value": float(x[i]),
            "z": float(z[i]),
            "score": float(np.median(np.abs(peer_z - z[i]))),
            "peer_median": float(np.median(peers)),
            "peer_p10": float(np.quantile(peers, 0.1)),
            "peer_p90": float(np.quantile(peers, 0.9)),
            "n_units": int(x.size),
        }
    return zs, out
