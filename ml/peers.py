"""Peer comparison (Minder, NSDI'24): the GPU that keeps behaving unlike its peers in a synchronous job.

Every GPU of a data-parallel job runs the same program in lock step, so per metric their window summaries
should agree. For each metric and sub-window: a robust summary per GPU (a winsorized mean, which tolerates
spikes and the compute/all-reduce duty cycle), a robust normalization across GPUs (median and MAD, with a
relative and an absolute floor so a quiet metric's tiny differences never count), then the outliers: far
from the centre, few, and separated from the rest by a clear gap (not merely the largest of the noise). A
GPU that is the outlier on a metric in every sub-window of the continuity period becomes a suspect.

Windows where the whole job is idle (hung, crashed, not started) are not compared: everyone is quiet and
whoever differs then is another detector's business (progress, signatures). GPUs without samples (a lost
GPU) simply drop out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from ml import changepoint, recurrence, windows
from ml.findings import Finding, JobInfo, PeerEvidence, PeerMetric, PeerWindow
from ml.metrics import GPU_TEMP, MEMORY_TEMP, POWER_USAGE, SM_CLOCK, WINDOW_S
from ml.peer_spans import (
    BUSY_METRICS,
    DEFAULT_PRIORITY,
    SPAN_S,
    SUPPORT_Z,
    Z_MIN,
    _spec,
    _utc,
    starved,
    strength,
    summarize_span,
)
from ml.peer_spans import SPECS as SPECS  # re-exported: the service reads peers.SPECS
from ml.quantities import significant

DETECTOR = "peers"
SUPPORT_WEIGHT = 0.5  # a supporting metric (SUPPORT_Z) counts for this fraction of its weight
HISTORY_FACTOR = 2  # windows analyzed beyond the continuity period, to date the onset
MAX_CONFIDENCE = 0.95
# The change point (ml/changepoint.py) over the spans ending at every window boundary, each giving the confidence
# its metrics would give alone. Four spans in a row at least: a GPU apart through 60 s, never one 30 s episode (three
# spans hold some of it), which the recurrence rule judges. Far out on several metrics (0.85 to 0.95 a span) it is
# named then; on two strong ones (about 0.75), after eight; on weaker ones (a temperature that lags a throttle,
# with one busy gauge: about 0.6) or one alone the continuity rule (120 s) judges it.
CHANGEPOINT_RULE = "changepoint"
CHANGEPOINT_DRIFT = 0.65
CHANGEPOINT_LEVEL = 0.8
CHANGEPOINT_MIN_STEPS = 4


def detect(
    job: JobInfo,
    metrics: pd.DataFrame,
    *,
    now: datetime,
    window_s: float = SPAN_S,
    continuity_s: float = 120,
    horizon_s: float = recurrence.HORIZON_S,
    metrics_priority: Sequence[str] = DEFAULT_PRIORITY,
) -> list[Finding]:
    """GPUs that are their peers' outlier on a metric in every sub-window of the continuity period, or again
    and again over the recurrence horizon, from raw samples: the same spans a service computes one at a time
    from stored windows (`summarize_span`), one per window through the continuity period as the service has them,
    back to back beyond it."""
    try:
        now = _utc(now)
        n_total = max(max(1, round(continuity_s / window_s)) * HISTORY_FACTOR, math.ceil(horizon_s / window_s))
        latest_end = windows.floor_time(now)
        since = latest_end - timedelta(seconds=n_total * window_s + WINDOW_S)
        frame = metrics[pd.to_datetime(metrics["ts"], utc=True, errors="coerce", format="mixed") >= since]
        rolled = windows.from_samples(frame)
        # Back to back over the horizon; at every window boundary through the continuity period too, where the
        # change point reads them (the recurrence rule reads the back-to-back ones, as it was tuned on them).
        ends = [latest_end - timedelta(seconds=i * window_s) for i in range(n_total)]
        dense = [latest_end - timedelta(seconds=k * WINDOW_S) for k in range(round(continuity_s / WINDOW_S))]
        spans = {
            end.isoformat(): summarize_span(job, rolled, end=end, span_s=window_s, metrics_priority=metrics_priority)
            for end in dict.fromkeys([*ends, *dense])
        }
        return from_spans(
            job,
            spans,
            latest_end=latest_end,
            span_s=window_s,
            continuity_s=continuity_s,
            horizon_s=horizon_s,
            recurrence_spans={end.isoformat(): spans[end.isoformat()] for end in ends},
        )
    except (LookupError, ValueError, TypeError, AttributeError, ArithmeticError):
        return []  # unreadable input: nothing to claim


def from_spans(
    job: JobInfo,
    spans: dict[str, dict[str, Any]],
    *,
    latest_end: datetime,
    span_s: float = SPAN_S,
    continuity_s: float = 120,
    horizon_s: float = recurrence.HORIZON_S,
    recurrence_spans: dict[str, dict[str, Any]] | None = None,
) -> list[Finding]:
    """Findings from span summaries keyed by their end (ISO): the GPUs flagged in every span of the continuity
    period, back to back from `latest_end` (a span that is missing or quiet ends the comparison), or sooner by the
    change point on the spans at every window boundary; then the GPUs flagged in separate episodes over the horizon
    (ml/recurrence.py, on `recurrence_spans` where given) that neither named."""
    findings = _continuity(job, spans, latest_end=latest_end, span_s=span_s, continuity_s=continuity_s)
    named = {(f.subject, f.category) for f in findings}
    recurrent = recurrence.detect(
        job, spans if recurrence_spans is None else recurrence_spans, latest_end=latest_end, span_s=span_s,
        horizon_s=horizon_s,
    )  # fmt: skip
    return findings + [f for f in recurrent if (f.subject, f.category) not in named]


def _continuity(
    job: JobInfo, spans: dict[str, dict[str, Any]], *, latest_end: datetime, span_s: float, continuity_s: float
) -> list[Finding]:
    n_cont = max(1, round(continuity_s / span_s))
    latest_end = _utc(latest_end)
    chain = []
    for i in range(n_cont * HISTORY_FACTOR):
        span = spans.get((latest_end - timedelta(seconds=i * span_s)).isoformat())
        if span is None:
            break
        chain.append(span)
    suspects: dict[str, list[dict[str, Any]]] = {}
    zscores: dict[str, list[dict[str, float]]] = {}
    if len(chain) >= n_cont and all(span["active"] for span in chain[:n_cont]):
        for metric in dict.fromkeys(m for span in chain for m in span["metrics"]):
            spec = _spec(metric)
            per_window = {
                w: span["metrics"].get(metric, {}).get("out", {}) for w, span in enumerate(chain) if span["active"]
            }
            zscores[metric] = [chain[w]["metrics"].get(metric, {}).get("z", {}) for w in range(n_cont)]
            for unit, record in _continuous(per_window, n_cont).items():
                record.update(metric=metric, category=spec.category, weight=spec.weight)
                suspects.setdefault(unit, []).append(record)
    for unit, records in _changepoints(spans, latest_end, span_s, n_cont).items():
        named = {r["category"] for r in suspects.get(unit, [])}
        suspects.setdefault(unit, []).extend(r for r in records if r["category"] not in named)
    findings = []
    for unit, records in suspects.items():
        support = _support(unit, records, zscores)
        findings += _findings(job, unit, records, support, latest_end, span_s, n_cont)
    return findings


def _changepoints(
    spans: dict[str, dict[str, Any]], latest_end: datetime, span_s: float, n_cont: int
) -> dict[str, list[dict[str, Any]]]:
    """Units the change point names before the continuity period is over (ml/changepoint.py). Each span ending at a
    window boundary, back from the latest, gives a unit and category its evidence: the confidence its metrics of
    that category would give on that span alone (flagged ones by their score, those SUPPORT_Z away at half weight,
    each on the side it stands in the latest span). The CUSUM of that evidence over CHANGEPOINT_DRIFT reaching
    CHANGEPOINT_LEVEL names the unit: several metrics far out together decide in a few spans, one metric alone adds
    nothing and waits for the continuity rule. The run ends at the first span (going back) with no metric of the
    category flagged, or one the job did not work through."""
    step, per_span = timedelta(seconds=WINDOW_S), max(1, round(span_s / WINDOW_S))  # overlapping spans per span
    chain = []  # latest first
    for k in range(n_cont * per_span):
        span = spans.get((latest_end - k * step).isoformat())
        if span is None or not span["active"]:
            break
        chain.append(span)
    if len(chain) < CHANGEPOINT_MIN_STEPS:
        return {}
    latest = chain[0]["metrics"]
    sides: dict[tuple[str, str], dict[str, float]] = {}  # (unit, category) -> metric -> side in the latest span
    for metric, entry in latest.items():
        category = _spec(metric).category
        for unit, z in entry.get("z", {}).items():
            sides.setdefault((unit, category), {})[metric] = math.copysign(1.0, z)
        for unit, rec in entry.get("out", {}).items():
            sides.setdefault((unit, category), {})[metric] = math.copysign(1.0, rec["z"])
    out: dict[str, list[dict[str, Any]]] = {}
    for (unit, category), metric_sides in sides.items():
        evidence = []
        for span in chain:
            level = _span_evidence(span["metrics"], unit, metric_sides)
            if level is None:
                break
            evidence.append(level)
        alarm = changepoint.alarm(evidence[::-1], drift=CHANGEPOINT_DRIFT, threshold=CHANGEPOINT_LEVEL)
        steps = len(evidence) - alarm.onset if alarm is not None else 0  # the spans since the change
        if steps < CHANGEPOINT_MIN_STEPS:
            continue
        back_to_back = chain[::per_span][: math.ceil(steps / per_span)]
        for metric, side in metric_sides.items():
            run = []
            for w, span in enumerate(back_to_back):
                rec = span["metrics"].get(metric, {}).get("out", {}).get(unit)
                if rec is None or math.copysign(1.0, rec["z"]) != side:
                    break
                run.append((w, rec))
            if not run:
                continue  # a supporting metric: in the evidence, not a record of its own
            spec = _spec(metric)
            out.setdefault(unit, []).append(
                {
                    "run": run,
                    "direction": "high" if side > 0 else "low",
                    "analyzed": len(back_to_back),
                    "rule": CHANGEPOINT_RULE,
                    "apart_s": span_s + (steps - 1) * WINDOW_S,  # the union of the spans since the change
                    "metric": metric,
                    "category": category,
                    "weight": spec.weight,
                }
            )
    return out


def _span_evidence(metrics: dict[str, Any], unit: str, sides: dict[str, float]) -> float | None:
    """The confidence one span alone gives that `unit` stands apart on these metrics (each on its side); None when
    none of them is flagged there."""
    miss, flagged = 1.0, False
    for metric, side in sides.items():
        entry = metrics.get(metric, {})
        rec = entry.get("out", {}).get(unit)
        if rec is not None and math.copysign(1.0, rec["z"]) == side:
            miss *= 1.0 - _spec(metric).weight * strength(rec["score"])
            flagged = True
        elif side * entry.get("z", {}).get(unit, 0.0) >= SUPPORT_Z:
            miss *= 1.0 - SUPPORT_WEIGHT * _spec(metric).weight
    return 1.0 - miss if flagged else None


def _continuous(per_window: dict[int, dict[str, dict[str, Any]]], n_cont: int) -> dict[str, dict[str, Any]]:
    """Units flagged, on the same side, in each of the latest `n_cont` windows; with their run of windows."""
    out: dict[str, dict[str, Any]] = {}
    latest = per_window.get(0, {})
    for unit, first in latest.items():
        side = math.copysign(1.0, first["z"])
        run: list[tuple[int, dict[str, Any]]] = []
        w = 0
        while w in per_window and unit in per_window[w] and math.copysign(1.0, per_window[w][unit]["z"]) == side:
            run.append((w, per_window[w][unit]))
            w += 1
        if len(run) >= n_cont:
            out[unit] = {"run": run, "direction": "high" if side > 0 else "low", "analyzed": len(per_window)}
    return out


def _support(
    unit: str, records: list[dict[str, Any]], zscores: dict[str, list[dict[str, float]]]
) -> list[dict[str, Any]]:
    """Other metrics of the suspect's category that lean the same way in every window without (yet) making
    the cut in each: an outlier now, and at least SUPPORT_Z away all along."""
    categories = {r["category"] for r in records}
    done = {r["metric"] for r in records}
    out = []
    for metric, per_span in zscores.items():
        spec = _spec(metric)
        if metric in done or spec.category not in categories or not per_span:
            continue
        z = [win.get(unit) for win in per_span]
        if any(v is None for v in z) or abs(z[0] or 0.0) < Z_MIN:
            continue
        zz = np.array(z, dtype=float)
        if np.all(np.sign(zz) == np.sign(zz[0])) and np.all(np.abs(zz) >= SUPPORT_Z):
            out.append(
                {
                    "metric": metric,
                    "category": spec.category,
                    "weight": SUPPORT_WEIGHT * spec.weight,
                    "direction": "high" if zz[0] > 0 else "low",
                    "z": [round(float(v), 3) for v in zz],  # latest first
                }
            )
    return out


# --- findings ---


def _findings(
    job: JobInfo,
    unit: str,
    records: list[dict[str, Any]],
    support: list[dict[str, Any]],
    now: datetime,
    window_s: float,
    n_cont: int,
) -> list[Finding]:
    """One finding per category the unit is a suspect for (straggler, nvlink, pcie, network)."""
    node, _, gpu = unit.rpartition("/")
    by_category: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record)
    out = []
    for category, recs in by_category.items():
        confidence = 1.0
        evidence_metrics: list[PeerMetric] = []
        onset_w = 0
        for rec in recs:
            run = rec["run"]
            onset_w = max(onset_w, run[-1][0])
            score = float(np.median([r["score"] for _, r in run[:n_cont]]))
            confidence *= 1.0 - rec["weight"] * strength(score)
            evidence_metrics.append(_metric_evidence(rec, now, window_s, score))
        supporting = [r for r in support if r["category"] == category]
        for rec in supporting:
            confidence *= 1.0 - rec["weight"]
        confidence = round(min(MAX_CONFIDENCE, 1.0 - confidence), 3)
        # The first flagged span starts before the fault more often than not (a fault 5 s into a 30 s span flags
        # it): the GPU is known to stand apart only at that span's end, which is when the finding is dated.
        onset = now - timedelta(seconds=(onset_w + 1) * window_s)
        apart_since = onset + timedelta(seconds=window_s)
        # Less busy than its peers: the GPU waits for its input. The machine is worth a look, not an eviction.
        idle = starved((m["metric"], m["direction"]) for m in evidence_metrics)
        evidence_metrics = most_telling_first(evidence_metrics, idle=idle)
        lead = evidence_metrics[0]
        names = ", ".join(m["metric"] for m in evidence_metrics)
        changed = [r["apart_s"] for r in recs if r.get("rule") == CHANGEPOINT_RULE]
        apart_s = max(changed) if changed else len(lead["windows"]) * window_s
        evidence: PeerEvidence = {
            "signals": [
                {
                    "type": "metric",
                    "node": node,
                    "gpu": int(gpu) if gpu.isdigit() else gpu,
                    "metric": m["metric"],
                    "from": m["windows"][-1]["start"],
                    "to": m["windows"][0]["end"],
                }
                for m in evidence_metrics
            ],
            "unit": unit,
            "job_id": job.job_id,
            "window_s": window_s,
            "continuity_s": n_cont * window_s,
            **({"rule": CHANGEPOINT_RULE} if all(r.get("rule") == CHANGEPOINT_RULE for r in recs) else {}),
            "metrics": evidence_metrics,
            "supporting": [{k: v for k, v in r.items() if k != "category"} for r in supporting],
        }
        out.append(
            Finding(
                detector=DETECTOR,
                category=category,
                subject_kind="gpu",
                subject=unit,
                confidence=confidence,
                summary=(
                    f"{node} GPU {gpu} is its peers' outlier for {apart_s:.0f} s "
                    f"({lead['direction']} {lead['metric']}: {significant(lead['windows'][0]['value'], 4)} vs peers "
                    f"{significant(lead['windows'][0]['peer_median'], 4)}); metrics: {names}"
                    + ("; less busy than its peers: waiting for its input, not slow" if idle else "")
                    + ("; a change point: far out on these at once" if evidence.get("rule") == CHANGEPOINT_RULE else "")
                ),
                observed_at=apart_since,
                node=node,
                blame="unknown" if idle else "infrastructure",
                role="cause",
                action="diagnose" if idle else "evict",
                # A job lives for weeks: the same GPU may lag again after its incident resolved. The onset tells
                # two episodes apart (a key without it dropped every later one); the series keeps one row per
                # episode while its onset slides with the window.
                key=f"{unit}:{category}:{onset:%Y%m%dT%H%M%S}",
                series=f"{unit}:{category}",
                seen_until=now,
                evidence=evidence,
            )
        )
    return out


# What tells a person why a GPU lags, first: a lower SM clock says it runs slower (throttled), a temperature or a power
# draw why. The busy counters (tensor and SM activity, utilization) only say it works longer each step, as any slow
# GPU does while its peers wait for it, so they follow, although they often stand out the most.
EXPLAINS_SLOWNESS = (SM_CLOCK, GPU_TEMP, MEMORY_TEMP, POWER_USAGE)


def most_telling_first(metrics: list[PeerMetric], *, idle: bool) -> list[PeerMetric]:
    """The finding's metrics in the order its summary and the incident page's plots show them: for a GPU less busy
    than its peers (waiting for its input, its clock and power low as any idle GPU's) the busy counters lead; for
    any other, EXPLAINS_SLOWNESS does. Otherwise the priority order they came in."""

    def rank(m: PeerMetric) -> int:
        if idle:
            return 0 if m["metric"] in BUSY_METRICS else 1
        metric = m["metric"]
        return EXPLAINS_SLOWNESS.index(metric) if metric in EXPLAINS_SLOWNESS else len(EXPLAINS_SLOWNESS)

    return sorted(metrics, key=rank)


def _metric_evidence(rec: dict[str, Any], now: datetime, window_s: float, score: float) -> PeerMetric:
    """What a UI plots: the suspect's window summary against the peers' median and p10-p90 band."""
    windows: list[PeerWindow] = []
    for w, r in rec["run"]:
        start = now - timedelta(seconds=(w + 1) * window_s)
        windows.append(
            {
                "start": start.isoformat(),
                "end": (start + timedelta(seconds=window_s)).isoformat(),
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()},
            }
        )
    return {
        "metric": rec["metric"],
        "direction": rec["direction"],
        "score": round(score, 3),
        "windows_flagged": len(rec["run"]),
        "windows_analyzed": rec["analyzed"],
        "windows": windows,  # latest first
    }
