"""Fail-slow: ranks or a whole job running slower than they should, judged over repeated rounds.

ByteRobust samples every 10 s and decides only after 5 rounds agree; so does this detector, three ways:
(a) per-rank step times, when ranks log their own and they differ: a rank slower than its peers in every
round is a straggler on its node; (b) the job's step time against its own earlier pace: 1.3x slower in
every round is a job-level slowdown the service localizes (stacks, peers); (c) per-rank process CPU against
peers: a rank whose CPU is the outlier in every round (busy while the others wait, or the reverse) is a
weaker suspect on its node, or the likely culprit of a hang when the steps stopped.

Rounds stretch to hold at least two steps (or two process snapshots) each: a job with 30-second steps is
judged over 5 rounds of a minute, not 5 empty ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from ml import parallel
from ml.findings import FailslowRound, Finding, JobInfo, LogRecord
from ml.progress import StepPoint, is_dead, process_frame, snapshot_interval, step_points, utc
from ml.quantities import significant

DETECTOR = "failslow"

SLOWDOWN_RATIO = 1.3  # job step time against its own baseline
RANK_RATIO = 1.1  # a straggler rank is at least this much slower than the peers' median...
Z_MIN = 4.0  # ... and this many robust scale units away
GAP_MIN = 2.0  # with a clear gap to the nearest peer
MAX_OUTLIER_FRACTION = 0.25
MIN_RANKS = 3
REL_FLOOR = 0.05  # step time: a scale never below 5% of the median
CPU_REL_FLOOR = 0.1
CPU_ABS_FLOOR = 10.0  # percentage points: CPU jitter below this never counts
MIN_BASELINE_CHUNKS = 3  # earlier round-long stretches needed to know the job's own pace...
BASELINE_CHUNKS = 30  # ... and the most that are looked at
MAX_ROUND_S = 600.0


@dataclass(frozen=True, slots=True)
class Round:
    """One decision round: [start, end)."""

    start: datetime
    end: datetime

    def json(self) -> dict[str, str]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat()}


def detect(
    job: JobInfo,
    *,
    steps: list[LogRecord],
    processes: pd.DataFrame | None,
    now: datetime,
    rounds: int = 5,
    round_s: float = 10,
) -> list[Finding]:
    """Straggler ranks (step time, CPU) and job-level slowdowns that held in every one of `rounds` rounds."""
    try:
        now = utc(now)
        rounds, round_s = int(rounds), float(round_s)
        if rounds < 1 or round_s <= 0:
            return []
        points = step_points(steps)
        out = _rank_step_times(job, points, now, rounds, round_s)
        out += _job_slowdown(job, points, now, rounds, round_s)
        out += _cpu_outliers(job, points, processes, now, rounds, round_s)
        return out
    except (LookupError, ValueError, TypeError, AttributeError, ArithmeticError):
        return []  # unreadable input: nothing to claim


def _rounds(now: datetime, rounds: int, length: float) -> list[Round]:
    """The latest `rounds` rounds of `length` seconds, latest first."""
    length = min(length, MAX_ROUND_S)
    return [
        Round(now - timedelta(seconds=(i + 1) * length), now - timedelta(seconds=i * length)) for i in range(rounds)
    ]


def _robust_outliers(values: dict[Any, float], rel_floor: float, abs_floor: float) -> tuple[dict[Any, float], float]:
    """Peers' robust z per member, but only for the few with a clear gap to the rest; and the peers' median."""
    if len(values) < MIN_RANKS:
        return {}, math.nan
    keys = list(values)
    x = np.array([values[k] for k in keys], dtype=float)
    center = float(np.median(x))
    scale = max(float(np.median(np.abs(x - center))) * 1.4826, rel_floor * abs(center), abs_floor, 1e-12)
    z = (x - center) / scale
    flagged = np.flatnonzero(np.abs(z) >= Z_MIN)
    if flagged.size == 0 or flagged.size > max(1, math.floor(MAX_OUTLIER_FRACTION * x.size)):
        return {}, center
    inliers = np.delete(z, flagged)
    return {keys[i]: float(z[i]) for i in flagged if np.min(np.abs(inliers - z[i])) >= GAP_MIN}, center


def _stages(job: JobInfo, ranks: Any) -> dict[int, int]:
    """Each rank's pipeline stage: stages run different layers and are only peers among themselves."""
    ranks = sorted({int(r) for r in ranks})
    if max(1, int(job.pp or 1)) <= 1 or not ranks:
        return dict.fromkeys(ranks, 0)
    stage = parallel.coordinates_array(job, np.array(ranks))["pp"]
    return {r: int(s) for r, s in zip(ranks, stage, strict=True)}


def _peer_outliers(
    values: dict[int, float], stages: dict[int, int], rel_floor: float, abs_floor: float
) -> tuple[dict[int, float], dict[int, float]]:
    """`_robust_outliers` within each pipeline stage: the flagged ranks' z, and each rank's peers' median."""
    flagged: dict[int, float] = {}
    centers: dict[int, float] = {}
    for stage in {stages.get(r, -1) for r in values}:
        mates = {r: v for r, v in values.items() if stages.get(r, -1) == stage}
        found, center = _robust_outliers(mates, rel_floor, abs_floor)
        flagged.update(found)
        centers.update(dict.fromkeys(mates, center))
    return flagged, centers


def _band(values: dict[int, float], stages: dict[int, int], rank: int) -> dict[str, float]:
    """The rank's stage mates' median and p10-p90 band."""
    stage = stages.get(rank, -1)
    peers = np.array([v for k, v in values.items() if k != rank and stages.get(k, -1) == stage], dtype=float)
    return {
        "peer_median": round(float(np.median(peers)), 3),
        "peer_p10": round(float(np.quantile(peers, 0.1)), 3),
        "peer_p90": round(float(np.quantile(peers, 0.9)), 3),
        "n_peers": int(peers.size),
    }


def _node_of(job: JobInfo, rank: int, fallback: str | None) -> str | None:
    return job.rank_nodes.get(rank, fallback) if job.rank_nodes else fallback


def _step_period(points: list[StepPoint]) -> float:
    """Typical seconds between two step lines of one stream (0 when unknown)."""
    by_stream: dict[tuple[str, int | None], list[float]] = {}
    for p in points:
        by_stream.setdefault(p.stream, []).append(p.ts.timestamp())
    gaps = [float(np.median(np.diff(ts))) for ts in by_stream.values() if len(ts) >= 3]
    gaps = [g for g in gaps if g > 0]
    return min(gaps) if gaps else 0.0


# --- (a) per-rank step times ---


def _rank_step_times(
    job: JobInfo, points: list[StepPoint], now: datetime, rounds: int, round_s: float
) -> list[Finding]:
    ranked = [p for p in points if p.stream[1] is not None and p.elapsed_ms is not None]
    if len({p.stream[1] for p in ranked}) < MIN_RANKS:
        return []
    windows = _rounds(now, rounds, max(round_s, 2.0 * _step_period(ranked)))
    stages = _stages(job, {p.stream[1] for p in ranked})
    per_round: list[tuple[Round, dict[int, float], dict[int, float], dict[int, float]]] = []
    for rnd in windows:
        values: dict[int, list[float]] = {}
        for p in ranked:
            if rnd.start <= p.ts < rnd.end:
                values.setdefault(p.stream[1], []).append(p.elapsed_ms)  # type: ignore[arg-type]
        medians = {r: float(np.median(v)) for r, v in values.items()}
        flagged, centers = _peer_outliers(medians, stages, REL_FLOOR, 1.0)
        slow = {r: z for r, z in flagged.items() if z > 0 and medians[r] >= RANK_RATIO * centers[r]}
        per_round.append((rnd, medians, slow, centers))
    common = set.intersection(*(set(slow) for _, _, slow, _ in per_round))
    nodes = {p.stream[1]: p.stream[0] for p in ranked}
    out = []
    for rank in sorted(common):
        node = _node_of(job, rank, nodes.get(rank))
        evidence_rounds: list[FailslowRound] = [
            {
                **rnd.json(),
                "rank_ms": round(medians[rank], 3),
                "ratio": round(medians[rank] / centers[rank], 3),
                "z": round(slow[rank], 2),
                **_band(medians, stages, rank),
            }
            for rnd, medians, slow, centers in per_round
        ]
        ratio = float(np.median([r["ratio"] for r in evidence_rounds]))
        ids = [p.record_id for p in ranked if p.stream[1] == rank and p.ts >= windows[-1].start][-20:]
        out.append(
            Finding(
                detector=DETECTOR,
                category="straggler",
                subject_kind="rank",
                subject=f"rank {rank}",
                confidence=round(0.55 + 0.35 * min(1.0, max(0.0, (ratio - RANK_RATIO) / 0.4)), 3),
                summary=(
                    f"rank {rank} on {node} takes {ratio:.2f}x its peers' step time in all {rounds} rounds "
                    f"({evidence_rounds[0]['rank_ms']:.0f} ms vs {evidence_rounds[0]['peer_median']:.0f} ms)"
                ),
                observed_at=windows[-1].start,
                node=node,
                blame="infrastructure",
                role="cause",
                action="evict",
                # A rank of a weeks-long job may lag again (on another machine after a restart): the first round
                # tells episodes apart, the series keeps one row while the rounds slide.
                key=f"rank_step_time:{rank}:{node}:{windows[-1].start:%Y%m%dT%H%M%S}",
                series=f"rank_step_time:{rank}:{node}",
                seen_until=windows[0].end,
                evidence={
                    "signals": [{"type": "log", "id": i} for i in ids],
                    "rank": rank,
                    "ratio": round(ratio, 3),
                    "rounds": evidence_rounds,
                },
            )
        )
    return out


# --- (b) job-level slowdown ---


def _since_restart(points: list[StepPoint]) -> list[StepPoint]:
    """The points after the job's last restart (a step going back well below the maximum seen)."""
    start, high = 0, -math.inf
    for i, p in enumerate(points):
        if p.step < high - 1:  # streams lag each other by a step; a restart goes back further
            start, high = i, p.step
        high = max(high, p.step)
    return points[start:]


def _seconds_per_step(points: list[StepPoint], start: datetime, end: datetime) -> tuple[float | None, str]:
    """The job's step time within [start, end): logged step times if most steps carry one, else the
    least-squares slope of time against step per logging stream (robust to whole-second stamps)."""
    inside = [p for p in points if start <= p.ts < end]
    if not inside:
        return None, ""
    steps = {p.step for p in inside}
    elapsed: dict[int, list[float]] = {}
    for p in inside:
        if p.elapsed_ms is not None:
            elapsed.setdefault(p.step, []).append(p.elapsed_ms)
    if len(elapsed) >= 0.5 * len(steps):
        return float(np.median([np.median(v) for v in elapsed.values()])) / 1000.0, "elapsed_ms"
    by_stream: dict[tuple[str, int | None], list[StepPoint]] = {}
    for p in inside:
        by_stream.setdefault(p.stream, []).append(p)
    slopes = []
    for pts in by_stream.values():
        x = np.array([p.step for p in pts], dtype=float)
        if len(pts) >= 2 and np.ptp(x) > 0:
            t = np.array([(p.ts - start).total_seconds() for p in pts])
            slopes.append(float(np.polyfit(x, t, 1)[0]))
    slopes = [v for v in slopes if v > 0]
    return (float(np.median(slopes)), "step_timestamps") if slopes else (None, "")


def _job_slowdown(job: JobInfo, points: list[StepPoint], now: datetime, rounds: int, round_s: float) -> list[Finding]:
    points = [p for p in _since_restart(points) if p.ts < now]
    if len(points) < 2:
        return []
    span_steps = points[-1].step - points[0].step
    typical = (points[-1].ts - points[0].ts).total_seconds() / span_steps if span_steps > 0 else 0.0
    windows = _rounds(now, rounds, max(round_s, 2.0 * typical))
    length = (windows[0].end - windows[0].start).total_seconds()
    earliest = windows[-1].start
    baseline_chunks = []
    for i in range(1, BASELINE_CHUNKS + 1):
        chunk_end = earliest - timedelta(seconds=(i - 1) * length)
        if chunk_end <= points[0].ts:
            break
        value, _ = _seconds_per_step(points, chunk_end - timedelta(seconds=length), chunk_end)
        if value is not None:
            baseline_chunks.append(value)
    if len(baseline_chunks) < MIN_BASELINE_CHUNKS:
        return []  # too young to know its own pace
    # The lower quartile: the job's usual pace even when a slowdown already fills part of the history.
    baseline = float(np.quantile(baseline_chunks, 0.25))
    per_round: list[FailslowRound] = []
    sources: set[str] = set()
    for rnd in windows:
        value, source = _seconds_per_step(points, rnd.start, rnd.end)
        if value is None:
            return []  # a round without steps: stopped, not slow (progress's business)
        sources.add(source)
        per_round.append({**rnd.json(), "step_s": round(value, 4), "ratio": round(value / baseline, 3)})
    ratios = [r["ratio"] for r in per_round]
    if baseline <= 0 or min(ratios) < SLOWDOWN_RATIO:
        return []
    ratio = float(np.median(ratios))
    recent = [p for p in points if p.ts >= earliest - timedelta(seconds=len(baseline_chunks) * length)]
    onset = _elapsed_change_point(recent) if sources == {"elapsed_ms"} else _change_point(recent)
    return [
        Finding(
            detector=DETECTOR,
            category="straggler",
            subject_kind="job",
            subject=job.job_id,
            confidence=round(0.5 + 0.3 * min(1.0, (ratio - SLOWDOWN_RATIO) / 0.7), 3),
            summary=(
                f"steps take {ratio:.2f}x the job's usual {significant(baseline)} s in all {rounds} rounds "
                f"(slow since step {onset.step})"
            ),
            observed_at=onset.ts,
            node=None,
            blame="unknown",
            role="cause",
            action="diagnose",
            key=f"slowdown:{onset.step}",
            evidence={
                "signals": [{"type": "log", "id": p.record_id} for p in points if p.ts >= earliest][-20:],
                "baseline_step_s": round(baseline, 4),
                "baseline_chunks": len(baseline_chunks),
                "ratio": round(ratio, 3),
                "source": "+".join(sorted(sources)),
                "onset_step": onset.step,
                "onset_at": onset.ts.isoformat(),
                "rounds": per_round,
            },
        )
    ]


def _change_point(points: list[StepPoint]) -> StepPoint:
    """Where the pace changed: the split of time-against-step into two straight lines with the least
    squared error. It depends on the data on both sides, not on a threshold, so re-runs agree on it."""
    x = np.array([p.step for p in points], dtype=float)
    t = np.array([(p.ts - points[0].ts).total_seconds() for p in points])
    n = len(points)
    if n < 6:
        return points[0]

    sums = [_prefix(v) for v in (x, t, x * x, x * t, t * t)]
    k = np.arange(3, n - 2)  # at least 3 points on each side
    left = _line_sse(k.astype(float), *(c[k] for c in sums))
    right = _line_sse((n - k).astype(float), *(c[n] - c[k] for c in sums))
    return points[int(k[np.argmin(left + right)])]


def _elapsed_change_point(points: list[StepPoint]) -> StepPoint:
    """Where the logged step time shifted: the split into two constant levels with the least squared error."""
    first: dict[int, StepPoint] = {}
    values: dict[int, list[float]] = {}
    for p in points:
        if p.elapsed_ms is not None:
            first.setdefault(p.step, p)
            values.setdefault(p.step, []).append(p.elapsed_ms)
    steps = sorted(values)
    n = len(steps)
    if n < 6:
        return points[0]
    v = np.array([np.median(values[s]) for s in steps])
    s1, s2 = _prefix(v), _prefix(v * v)
    k = np.arange(3, n - 2)
    left = s2[k] - s1[k] ** 2 / k
    right = (s2[n] - s2[k]) - (s1[n] - s1[k]) ** 2 / (n - k)
    return first[steps[int(k[np.argmin(left + right)])]]


def _prefix(v: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(v)))


def _line_sse(
    n: np.ndarray, sx: np.ndarray, st: np.ndarray, sxx: np.ndarray, sxt: np.ndarray, stt: np.ndarray
) -> np.ndarray:
    """Squared error of the least-squares line t ~ x, from the segments' sums (vectorized over splits)."""
    var_x = np.maximum(sxx - sx * sx / n, 1e-12)
    return stt - st * st / n - (sxt - sx * st / n) ** 2 / var_x


# --- (c) process CPU against peers ---

CpuRound = tuple[Round, dict[int, float], dict[int, float]]  # the round, each rank's median CPU, the outliers' z


def _cpu_outliers(
    job: JobInfo,
    points: list[StepPoint],
    processes: pd.DataFrame | None,
    now: datetime,
    rounds: int,
    round_s: float,
) -> list[Finding]:
    frame = process_frame(processes, now)
    if frame is None:
        return []
    frame = frame.dropna(subset=["rank", "cpu_pct"])
    frame = frame[[not is_dead(s) for s in frame["state"]]]
    if frame["rank"].nunique() < MIN_RANKS:
        return []
    windows = _rounds(now, rounds, max(round_s, 2.0 * snapshot_interval(frame)))
    # Rank 0 and the ranks that print the step lines do extra host work by design: never "busy" outliers.
    extra_work = {0} | {p.stream[1] for p in points if p.stream[1] is not None}
    stages = _stages(job, frame["rank"])
    per_round: list[CpuRound] = []
    for rnd in windows:
        inside = frame[(frame["ts"] >= pd.Timestamp(rnd.start)) & (frame["ts"] < pd.Timestamp(rnd.end))]
        medians = {int(r): float(v) for r, v in inside.groupby("rank")["cpu_pct"].median().items()}
        flagged, _ = _peer_outliers(medians, stages, CPU_REL_FLOOR, CPU_ABS_FLOOR)
        flagged = {r: z for r, z in flagged.items() if z < 0 or r not in extra_work}
        per_round.append((rnd, medians, flagged))
    common = set.intersection(*(set(flagged) for _, _, flagged in per_round))
    stalled = _no_progress(points, windows[-1].start)
    nodes = dict(zip(frame["rank"].astype(int), frame["node"], strict=True))
    out = []
    for rank in sorted(common):
        signs = {math.copysign(1.0, flagged[rank]) for _, _, flagged in per_round}
        if len(signs) != 1:
            continue
        evidence_rounds: list[FailslowRound] = [
            {**rnd.json(), "rank_cpu_pct": round(med[rank], 2), "z": round(fl[rank], 2), **_band(med, stages, rank)}
            for rnd, med, fl in per_round
        ]
        out.append(_cpu_finding(job, rank, nodes.get(rank), evidence_rounds, stalled, signs.pop() < 0))
    return out


def _no_progress(points: list[StepPoint], since: datetime) -> bool:
    """Whether the job logged steps before `since` and none changed after it (a hang, not slowness)."""
    if not points or points[0].ts >= since:
        return False
    last_before = max((p.step for p in points if p.ts < since), default=None)
    return all(p.step == last_before for p in points if p.ts >= since)


def _cpu_finding(
    job: JobInfo, rank: int, node_hint: str | None, evidence_rounds: list[FailslowRound], stalled: bool, low: bool
) -> Finding:
    node = _node_of(job, rank, node_hint)
    rounds = len(evidence_rounds)
    start = evidence_rounds[-1]["start"]
    score = float(np.median([abs(r["z"]) for r in evidence_rounds]))
    category = "hang" if stalled else "straggler"
    how = "idle while its peers are busy" if low else "busy while its peers wait"
    first = evidence_rounds[0]
    return Finding(
        detector=DETECTOR,
        category=category,
        subject_kind="rank",
        subject=f"rank {rank}",
        confidence=round(0.35 + 0.15 * min(1.0, max(0.0, (score - Z_MIN) / (2 * Z_MIN))) + 0.05 * stalled, 3),
        summary=(
            f"rank {rank} on {node} is {how} in all {rounds} rounds (CPU {first['rank_cpu_pct']:.0f}% vs peers "
            f"{first['peer_median']:.0f}%){'; the job makes no progress' if stalled else ''}"
        ),
        observed_at=datetime.fromisoformat(start),
        node=node,
        blame="unknown",
        role="cause",
        action="diagnose",
        key=f"cpu:{rank}:{node}:{'low' if low else 'high'}:{category}:{start}",
        series=f"cpu:{rank}:{node}:{'low' if low else 'high'}:{category}",
        seen_until=datetime.fromisoformat(evidence_rounds[0]["end"]),
        evidence={
            "signals": [{"type": "process", "rank": rank, "node": node, "from": start}],
            "rank": rank,
            "direction": "low" if low else "high",
            "job_progressing": not stalled,
            "rounds": evidence_rounds,
        },
    )
