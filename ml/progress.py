"""Progress: a job whose processes live but whose training steps stopped is hung.

Step records (the agents' `step` events) say when each rank, or each logging stream, last moved; the job
has made progress when any stream's step changed. No change for the job's hang timeout (stretched when
the job logs rarely) while most ranks' processes are alive is a suspected hang: the finding asks the
service to dump every rank's stack, which then names the culprit. A job that never logged a step falls
back to GPU activity: compute (tensor/SM activity, power) collapsing across the whole job for the timeout
after it was working. Dead processes end the claim: a crash is another detector's business.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from ml.findings import Finding, JobInfo, LogRecord, ProgressEvidence
from ml.metrics import FB_USED, POWER_USAGE, SM_ACTIVE, TENSOR_ACTIVE
from ml.quantities import significant

DETECTOR = "progress"

LOG_GAP_FACTOR = 3.0  # a job logging every N s is not hung before 3 N s without a line
MIN_ALIVE_FRACTION = 0.5  # of the expected ranks whose processes must still live
# Agents send process snapshots every few seconds: none for this long (or 4 intervals) means none live, and
# a rank missing from the latest snapshots for 2.5 intervals (at least STALE_S) is gone.
FRESH_S = 30.0
APPEARED_S = 10.0  # processes first sampled this long after the snapshots read begin are new (a restart)
STALE_S = 10.0
DEAD_STATES = frozenset({"z", "x", "zombie", "dead"})
FB_USED_ALIVE_MIB = 1024.0  # without process snapshots: a GPU holding this much memory has its process
BUCKET_S = 10.0
# Activity fallback: gauge, the level that counts as working before, and the absolute floor below which
# it has collapsed (also below COLLAPSE_RATIO of the earlier level).
_ACTIVITY = ((TENSOR_ACTIVE, 0.05, 0.01), (SM_ACTIVE, 0.15, 0.05), (POWER_USAGE, 0.0, 0.0))
COLLAPSE_RATIO = 0.3
POWER_COLLAPSE_RATIO = 0.45  # power never reaches zero: idle draw is a fifth of a working GPU's
MIN_COVERAGE = 0.8  # of the timeout's buckets that must have samples to claim a collapse
ACTIVITY_COLUMNS = tuple(column for column, _, _ in _ACTIVITY)


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One step record reduced to what progress needs."""

    ts: datetime
    stream: tuple[str, int | None]  # (node, rank): who logged it
    step: int
    elapsed_ms: float | None
    record_id: int


@dataclass(frozen=True, slots=True)
class Liveness:
    """How many of the job's processes are alive now, according to which source."""

    n_alive: int
    expected: int
    source: str  # "processes" (ranks) or "gpu_memory" (GPUs holding memory)
    missing: tuple[int, ...] = ()  # ranks without a live process, when processes tell
    restarted_at: datetime | None = None  # when the current processes appeared, if they replaced others

    @property
    def ok(self) -> bool:
        return self.n_alive >= max(1, math.ceil(MIN_ALIVE_FRACTION * self.expected))


def detect(
    job: JobInfo,
    *,
    steps: list[LogRecord],
    processes: pd.DataFrame | None,
    metrics: pd.DataFrame | None,
    now: datetime,
    activity: pd.DataFrame | None = None,
    processes_since: datetime | None = None,
) -> list[Finding]:
    """A job-level hang finding when steps (or, lacking any, GPU activity) stopped while processes live.
    GPU activity comes as raw `metrics`, or already summarized per bucket as `job_activity` shapes it;
    `processes_since` is where the process snapshots given begin (the caller's lookback)."""
    try:
        now = utc(now)
        if activity is None:
            activity = job_activity(job, metrics, now)
        live = liveness(job, processes, activity, now, since=processes_since)
        if live is None or not live.ok:
            return []
        points = step_points(steps)
        if points:
            return _step_hang(job, points, live, activity, now)
        return _activity_hang(job, live, activity, now)
    except (LookupError, ValueError, TypeError, AttributeError, ArithmeticError):
        return []  # unreadable input: nothing to claim


# --- shared readers (failslow uses them too) ---


def numeric(values: pd.Series) -> pd.Series:
    """Floats from whatever the column holds (strings, booleans, None): unreadable values become NaN."""
    return pd.to_numeric(values, errors="coerce").astype("float64")


def utc(ts: datetime) -> datetime:
    """Timezone-aware UTC; naive stamps are taken as UTC."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def step_points(steps: Iterable[LogRecord] | None) -> list[StepPoint]:
    """The readable step records, oldest first; anything without a whole step number is skipped."""
    out = []
    for record in steps or ():
        try:
            fields = record.fields or {}
            if record.kind != "step" and "step" not in fields:
                continue
            step = fields.get("step")
            if isinstance(step, bool) or step is None:
                continue
            step_f = float(step)
            if not math.isfinite(step_f) or step_f != int(step_f):
                continue
            elapsed = _positive(fields.get("elapsed_ms"))
            rank = int(record.rank) if record.rank is not None else None
            out.append(StepPoint(utc(record.ts), (str(record.node), rank), int(step_f), elapsed, int(record.id)))
        except (TypeError, ValueError, AttributeError, OverflowError):
            continue
    out.sort(key=lambda p: (p.ts, p.record_id))
    return out


def _positive(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def process_frame(processes: pd.DataFrame | None, now: datetime) -> pd.DataFrame | None:
    """Process snapshots up to `now` with usable stamps; None when there are none."""
    if not isinstance(processes, pd.DataFrame) or processes.empty or "ts" not in processes.columns:
        return None
    frame = processes.copy()
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True, errors="coerce", format="mixed")
    frame = frame.dropna(subset=["ts"])
    frame = frame[frame["ts"] <= pd.Timestamp(now)]
    for column in ("rank", "pid", "cpu_pct"):
        frame[column] = numeric(frame[column]) if column in frame.columns else np.nan
    if "node" not in frame.columns:
        frame["node"] = ""
    frame["node"] = frame["node"].astype(str)
    frame["state"] = frame["state"].astype(str).str.strip().str.lower() if "state" in frame.columns else ""
    return frame if not frame.empty else None


def is_dead(state: str) -> bool:
    """Zombie or dead, as /proc spells it ("Z", "X") or in words."""
    state = state.strip().lower()
    return state in DEAD_STATES or state.split(" ")[0] in DEAD_STATES


def snapshot_interval(frame: pd.DataFrame) -> float:
    """The typical seconds between two snapshots of one process."""
    keys = [c for c in ("node", "rank", "pid") if c in frame.columns]
    gaps = frame.sort_values("ts").groupby(keys, dropna=False)["ts"].diff().dt.total_seconds().dropna()
    gaps = gaps[gaps > 0]
    return float(gaps.median()) if not gaps.empty else 0.0


# --- who is alive ---


def liveness(
    job: JobInfo,
    processes: pd.DataFrame | None,
    activity: pd.DataFrame | None,
    now: datetime,
    *,
    since: datetime | None = None,
) -> Liveness | None:
    """The job's live ranks from process snapshots (read from `since`, when known), else from GPU memory held;
    None when nothing tells."""
    frame = process_frame(processes, now)
    if frame is not None:
        return _from_processes(job, frame, now, since)
    return _from_gpu_memory(activity, now)


def _from_processes(job: JobInfo, frame: pd.DataFrame, now: datetime, since: datetime | None = None) -> Liveness:
    interval = snapshot_interval(frame)
    ranked = frame.dropna(subset=["rank"])
    seen = {int(r) for r in ranked["rank"]}
    expected = job.world_size or len(job.rank_nodes) or len(seen)
    newest = ranked["ts"].max() if not ranked.empty else None
    if newest is None or (pd.Timestamp(now) - newest).total_seconds() > max(FRESH_S, 4.0 * interval):
        return Liveness(0, max(expected, 1), "processes", tuple(range(expected)))
    recent = ranked[ranked["ts"] >= newest - pd.Timedelta(seconds=max(STALE_S, 2.5 * interval))]
    latest = recent.sort_values("ts").groupby("rank").tail(1)
    alive = {int(r) for r, s in zip(latest["rank"], latest["state"], strict=True) if not is_dead(s)}
    missing = tuple(sorted(set(range(expected)) - alive))
    live = latest[latest["rank"].isin(alive)]
    restarted = _restart_time(ranked, live) or _appeared(ranked, since, interval)
    return Liveness(len(alive), max(expected, 1), "processes", missing, restarted)


def _appeared(ranked: pd.DataFrame, since: datetime | None, interval: float) -> datetime | None:
    """When the job's processes first showed up, if the snapshots read from `since` held none of its processes for
    a while first: the ones before them were gone before the window began (the job waited for a spare longer than
    the window), so these are new. Without this, a job restarting after such a wait was judged hung from its last
    step, and its stacks, dumped while a new rank still read its first batch, accused that rank's healthy machine."""
    if since is None or ranked.empty:
        return None
    first = ranked["ts"].min()
    # A process running all along is sampled within one interval of the window's start; twice that is later. (At
    # FRESH_S, the campaign's restart 24 s into a window of 10 s snapshots was the stalled job's: a hang incident.)
    if (first - pd.Timestamp(utc(since))).total_seconds() <= max(APPEARED_S, 2.0 * interval):
        return None
    return first.floor("us").to_pydatetime()


def _restart_time(ranked: pd.DataFrame, live: pd.DataFrame) -> datetime | None:
    """When the live processes first showed up, if other pids held the same ranks before them."""
    if live.empty or live["pid"].isna().all():
        return None
    current = ranked["rank"].map(dict(zip(live["rank"], live["pid"], strict=True)))
    mine = ranked[current.notna()]
    current = current[current.notna()]
    if bool((mine["pid"] == current).all()):
        return None
    return mine.loc[mine["pid"] == current, "ts"].min().floor("us").to_pydatetime()


def _from_gpu_memory(activity: pd.DataFrame | None, now: datetime) -> Liveness | None:
    """Without process snapshots: a GPU still holding memory has a live process (a lost GPU's series end)."""
    if activity is None or "gpus_seen" not in activity.columns or not activity["gpus_seen"].max() > 0:
        return None
    recent = activity[activity.index >= (now - timedelta(seconds=FRESH_S)).timestamp() - BUCKET_S]
    # The busiest recent bucket: the newest may be half-filled (GPUs are sampled apart).
    alive = int(recent["gpus_alive"].max()) if not recent.empty else 0
    return Liveness(alive, int(activity["gpus_seen"].max()), "gpu_memory")


def metric_frame(job: JobInfo, metrics: pd.DataFrame | None, now: datetime) -> pd.DataFrame | None:
    """Metric samples of the job's nodes up to `now`, with a "node/gpu" unit."""
    if not isinstance(metrics, pd.DataFrame) or metrics.empty or not {"ts", "node"} <= set(metrics.columns):
        return None
    frame = metrics.copy()
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True, errors="coerce", format="mixed")
    frame = frame.dropna(subset=["ts", "node"])
    frame = frame[frame["ts"] <= pd.Timestamp(now)]
    nodes = set(job.nodes)
    if nodes and frame["node"].isin(nodes).any():
        frame = frame[frame["node"].isin(nodes)]
    if frame.empty:
        return None
    gpu = frame["gpu"].astype(str) if "gpu" in frame.columns else ""
    frame["unit"] = frame["node"].astype(str) + "/" + gpu
    return frame


# --- hang from step records ---


def _step_hang(
    job: JobInfo, points: list[StepPoint], live: Liveness, activity: pd.DataFrame | None, now: datetime
) -> list[Finding]:
    changes = _changes(points)
    last = max((pts[-1] for pts in changes.values()), key=lambda p: (p.ts, p.step))
    timeout = _effective_timeout(job.hang_timeout_s, changes)
    anchor = last.ts
    if live.restarted_at is not None and live.restarted_at > anchor:
        anchor = live.restarted_at  # new processes (a restart) get their own time to log a first step
    stalled = (now - anchor).total_seconds()
    if stalled < timeout:
        return []
    last_step = last.step
    busy = _gpus_computing(activity, now, timeout)
    confidence = 0.75 if busy else 0.9
    evidence: ProgressEvidence = {
        "signals": [{"type": "log", "id": last.record_id}],
        "last_step": last_step,
        "last_step_at": last.ts.isoformat(),
        "seconds_without_progress": round(stalled, 1),
        "timeout_s": round(timeout, 1),
        "hang_timeout_s": job.hang_timeout_s,
        **_live_evidence(live),
    }
    if live.restarted_at is not None and anchor == live.restarted_at:
        evidence["restarted_at"] = anchor.isoformat()
    if busy:
        evidence["gpus_computing"] = True  # a kernel that never ends, or a job that stopped logging
    summary = (
        f"no training progress for {stalled:.0f} s (last step {last_step} at {last.ts:%H:%M:%S}) while "
        f"{_alive_text(live)}"
    )
    return [
        _finding(
            job, summary, confidence, anchor + timedelta(seconds=timeout), f"{last_step}:{anchor.isoformat()}", evidence
        )
    ]


def _changes(points: list[StepPoint]) -> dict[tuple[str, int | None], list[StepPoint]]:
    """Per logging stream, the records where its step changed (a restart's step going back counts)."""
    out: dict[tuple[str, int | None], list[StepPoint]] = {}
    for p in points:
        seq = out.setdefault(p.stream, [])
        if not seq or seq[-1].step != p.step:
            seq.append(p)
    return out


def _effective_timeout(timeout: float, changes: dict[tuple[str, int | None], list[StepPoint]]) -> float:
    """The job's timeout, stretched for a job that logs a step line only every few minutes."""
    gaps = []
    for pts in changes.values():
        if len(pts) >= 3:
            diffs = np.diff([p.ts.timestamp() for p in pts])
            gaps.append(float(np.median(diffs)))
    typical = min(gaps) if gaps else 0.0
    return max(float(timeout), LOG_GAP_FACTOR * typical)


def _gpus_computing(activity: pd.DataFrame | None, now: datetime, span: float) -> bool:
    """Whether the job's GPUs kept computing (tensor/SM activity) through the stall."""
    if activity is None:
        return False
    recent = activity[activity.index >= (now - timedelta(seconds=min(span, 120.0))).timestamp() - BUCKET_S]
    for column, working, _ in _ACTIVITY[:2]:
        if column in recent.columns:
            values = recent[column].dropna()
            if not values.empty:
                return bool(values.median() >= working)
    return False


# --- hang from GPU activity (no step records) ---


def _activity_hang(job: JobInfo, live: Liveness, activity: pd.DataFrame | None, now: datetime) -> list[Finding]:
    timeout = float(job.hang_timeout_s)
    if activity is None or timeout <= 0:
        return []
    for column, working, floor in _ACTIVITY:
        if column not in activity.columns:
            continue
        level = activity[column].dropna()
        if level.empty:
            continue
        return _collapse(job, live, level, column, working, floor, now, timeout)
    return []


def job_activity(job: JobInfo, metrics: pd.DataFrame | None, now: datetime) -> pd.DataFrame | None:
    """Per BUCKET_S bucket (index: its start, epoch seconds): the job's median GPU of each activity gauge
    (a GPU's bucket mean), and how many GPUs report memory use (`gpus_seen`) and hold enough for a live
    process (`gpus_alive`). A service computes the same per stored window."""
    frame = metric_frame(job, metrics, now)
    if frame is None:
        return None
    seconds = (frame["ts"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds()  # whatever the stamps' resolution
    bucket = (seconds // BUCKET_S * BUCKET_S).astype("int64")
    columns: dict[str, pd.Series] = {}
    for column in ACTIVITY_COLUMNS:
        if column not in frame.columns:
            continue
        values = numeric(frame[column])
        ok = values.notna()
        if ok.mean() < 0.5:
            continue  # too sparse to speak for the job
        per_unit = values[ok].groupby([bucket[ok], frame["unit"][ok]]).mean()
        columns[column] = per_unit.groupby(level=0).median()
    if FB_USED in frame.columns:
        used = numeric(frame[FB_USED])
        ok = used.notna()
        last = used[ok].groupby([bucket[ok], frame["unit"][ok]]).last()
        columns["gpus_alive"] = (last >= FB_USED_ALIVE_MIB).groupby(level=0).sum()
        columns["gpus_seen"] = last.groupby(level=0).size()
    if not columns:
        return None
    return pd.DataFrame(columns).sort_index()


def _collapse(
    job: JobInfo,
    live: Liveness,
    level: pd.Series,
    column: str,
    working: float,
    floor: float,
    now: datetime,
    timeout: float,
) -> list[Finding]:
    """A hang finding when the job worked before and its activity stayed collapsed for the timeout."""
    # Judge the timeout up to the newest bucket: stored windows close a little after real time.
    start = min(now.timestamp(), float(level.index.max()) + BUCKET_S) - timeout
    before, during = level[level.index < start - BUCKET_S], level[level.index >= start]
    expected_buckets = timeout / BUCKET_S
    if before.empty or len(during) < MIN_COVERAGE * expected_buckets:
        return []  # nothing to compare with, or the timeout is not covered (a young job, missing data)
    prior = float(before.quantile(0.9))
    if prior <= 0 or prior < working:
        return []  # it never worked: starting up, not hung
    ratio = POWER_COLLAPSE_RATIO if column == POWER_USAGE else COLLAPSE_RATIO
    threshold = max(floor, ratio * prior)
    if not bool((during < threshold).all()):
        return []
    low = level < threshold
    onset = int(level.index[-1])
    for ts, is_low in zip(level.index[::-1], low.to_numpy()[::-1], strict=True):
        if not is_low:
            break
        onset = int(ts)
    onset_at = datetime.fromtimestamp(onset, UTC)
    stalled = now.timestamp() - onset
    evidence: ProgressEvidence = {
        "signals": [{"type": "metric", "metric": column, "from": onset_at.isoformat(), "to": now.isoformat()}],
        "metric": column,
        "level_before": round(prior, 4),
        "level_now": round(float(during.median()), 4),
        "collapsed_since": onset_at.isoformat(),
        "seconds_without_activity": round(stalled, 1),
        "hang_timeout_s": job.hang_timeout_s,
        **_live_evidence(live),
    }
    summary = (
        f"no step records and GPU {column} collapsed across the job "
        f"({significant(prior)} -> {significant(float(during.median()))}) "
        f"for {stalled:.0f} s while {_alive_text(live)}"
    )
    at = onset_at + timedelta(seconds=timeout)
    return [_finding(job, summary, 0.7, at, f"activity:{onset}", evidence)]


# --- output ---


def _alive_text(live: Liveness) -> str:
    what = "ranks are alive" if live.source == "processes" else "GPUs still hold memory"
    return f"{live.n_alive} of {live.expected} {what}"


def _live_evidence(live: Liveness) -> ProgressEvidence:
    if live.source == "processes":
        return {"ranks_alive": live.n_alive, "ranks_expected": live.expected, "ranks_missing": list(live.missing[:64])}
    return {"gpus_holding_memory": live.n_alive, "gpus_seen": live.expected}


def _finding(
    job: JobInfo, summary: str, confidence: float, observed_at: datetime, key: str, evidence: ProgressEvidence
) -> Finding:
    return Finding(
        detector=DETECTOR,
        category="hang",
        subject_kind="job",
        subject=job.job_id,
        confidence=confidence,
        summary=summary,
        observed_at=observed_at,
        node=None,
        blame="unknown",
        role="cause",
        action="diagnose",
        key=f"hang:{key}",
        evidence=evidence,
    )
