"""Recurrence: the GPU that is its peers' outlier again and again, with normal stretches in between.

The continuity rule (ml/peers.py) wants an outlier in every span of its 120 s period; a fail-slow GPU that comes
and goes (thermal cycling, a flaky fan, power capping on and off) never satisfies it. This rule reads the same
span summaries (ml/peer_spans.py) over a longer horizon and groups each GPU's outlier spans, per metric and
direction, into episodes: flagged spans that follow each other, or are only apart for spans overlapping the last
flagged one. A clean span (the job working, the GPU not flagged) lying wholly after an episode's last flagged span
ends it. Spans where the job was not working (a checkpoint, a hang) or not through all of it (it started, stopped or
restarted in the span: GPUs stop and start seconds apart, and stand apart for it) are skipped: they neither count
nor end one. A job restarting around each fault of a busy stretch would otherwise give a healthy GPU an "episode"
at every restart (the 30-min demo's healthy node-000, 3 episodes at the job's start and two restarts).

A GPU with MIN_EPISODES separate episodes in the horizon on at least MIN_METRICS of its metrics is a recurrent
straggler, unless a GPU of another machine recurs nearly as often (then the job, not a machine, comes and goes),
or it is starved rather than slow: a throttled GPU works longer than its peers each step (busier), a GPU waiting
for its input (a data loader starved of CPU, a slow filesystem) works less, and its clock drops with it as any
idle GPU's does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from ml.evidence import PeerEpisode
from ml.findings import Finding, JobInfo, PeerEvidence, PeerMetric, PeerWindow
from ml.peer_spans import _spec, _utc, busier, starved, strength
from ml.quantities import significant

DETECTOR = "peers"
# Ten minutes: three episodes of a cycle up to ~4 min (on + off), well inside the 20 min a fail-slow GPU costs
# a job before someone looks; short enough that a GPU's one-offs of a long day do not add up.
HORIZON_S = 600.0
# One episode is a transient, two can be chance (a stall, then a spike); three separate ones are a pattern.
MIN_EPISODES = 3
# A slow GPU comes and goes on several signals at once (it works longer each step: more SM and tensor activity, and
# a lower clock or power when it throttles). One metric alone coming and going is the windows cutting the steps'
# phases differently: the demo's healthy node-003 GPU 2 had 3 episodes of high tensor_active in 10 min, its clock,
# power and SM activity its peers' all along, and was evicted. Signals, not metrics: a link's rx and tx bytes are one
# (the 15-min demo's healthy node-000 GPU 4, low NVLink rx and tx in 3 episodes after another node's eviction).
MIN_METRICS = 2
# A metric that recurs on one side and stood apart on the other side this often is beating, not recurring: a
# sampling beat's episodes alternate sides, so a third on one side comes with at least a second on the other.
BEAT_EPISODES = MIN_EPISODES - 1
# Confidence kept for 3, 4, 5+ episodes: a third episode is a pattern, each one after it makes it surer.
EPISODE_FACTOR = (0.9, 0.95, 1.0)
MAX_CONFIDENCE = 0.95  # as ml/peers.py: a metric comparison is never certain


@dataclass(slots=True)
class Episode:
    """One stretch of spans where a GPU stood apart on a metric, on one side; `peak` is its farthest span's record."""

    metric: str
    direction: str  # "high" | "low"
    start: datetime  # the first flagged span's start
    last_end: datetime  # the last flagged span's end
    spans: int
    peak: dict[str, Any]
    peak_end: datetime


def episodes(
    spans: dict[str, dict[str, Any]], *, latest_end: datetime, span_s: float, horizon_s: float = HORIZON_S
) -> dict[str, list[Episode]]:
    """Per unit, its episodes (every metric and side) in the horizon ending at `latest_end`, oldest first."""
    latest_end = _utc(latest_end)
    oldest = latest_end - timedelta(seconds=horizon_s)
    timeline = []
    for key, span in spans.items():
        end = _utc(datetime.fromisoformat(key))
        if oldest < end <= latest_end and span.get("active") and span.get("steady", True):
            timeline.append((end, span))
    timeline.sort(key=lambda item: item[0])
    open_: dict[tuple[str, str, str], Episode] = {}
    done: dict[str, list[Episode]] = {}
    for end, span in timeline:
        flagged = set()
        for metric, entry in span.get("metrics", {}).items():
            for unit, rec in entry.get("out", {}).items():
                side = "high" if rec["z"] > 0 else "low"
                key = (unit, metric, side)
                flagged.add(key)
                ep = open_.get(key)
                if ep is None:
                    open_[key] = Episode(metric, side, end - timedelta(seconds=span_s), end, 1, rec, end)
                    continue
                ep.last_end, ep.spans = end, ep.spans + 1
                if abs(rec["z"]) > abs(ep.peak["z"]):
                    ep.peak, ep.peak_end = rec, end
        # A clean span starting at or after an episode's last flagged end: the GPU was back among its peers.
        for key in [
            k for k, ep in open_.items() if k not in flagged and end - timedelta(seconds=span_s) >= ep.last_end
        ]:
            done.setdefault(key[0], []).append(open_.pop(key))
    for key, ep in open_.items():
        done.setdefault(key[0], []).append(ep)
    for eps in done.values():
        eps.sort(key=lambda ep: ep.start)
    return done


def detect(
    job: JobInfo,
    spans: dict[str, dict[str, Any]],
    *,
    latest_end: datetime,
    span_s: float,
    horizon_s: float = HORIZON_S,
) -> list[Finding]:
    """Recurrent stragglers from span summaries keyed by their end (ISO): one finding per GPU and category."""
    latest_end = _utc(latest_end)
    per_unit = episodes(spans, latest_end=latest_end, span_s=span_s, horizon_s=horizon_s)
    # Per unit and category: each (metric, side)'s episodes; how often the unit recurs is its most frequent one.
    grouped: dict[tuple[str, str], dict[tuple[str, str], list[Episode]]] = {}
    for unit, eps in per_unit.items():
        for ep in eps:
            key = (unit, _spec(ep.metric).category)
            grouped.setdefault(key, {}).setdefault((ep.metric, ep.direction), []).append(ep)
    often = {key: max(len(v) for v in by_metric.values()) for key, by_metric in grouped.items()}
    one_sided = {key: _one_sided(by_metric) for key, by_metric in grouped.items()}
    # Per unit, over every category: how many of its signals recur.
    corroborated: dict[str, set[str]] = {}
    for (unit, _), recurring in one_sided.items():
        corroborated.setdefault(unit, set()).update(_signal(m) for m, _ in recurring)
    findings = []
    for (unit, category), by_metric in grouped.items():
        n = often[(unit, category)]
        if n < MIN_EPISODES:
            continue
        node = unit.rpartition("/")[0]
        rivals = [
            m
            for (other, cat), m in often.items()
            if cat == category and other != unit and other.rpartition("/")[0] != node
        ]
        # Another machine's GPU recurring nearly as often: the job comes and goes, not this GPU (a GPU of the same
        # machine is no rival: a fan or power supply cycling takes several of its GPUs, the machine is still bad).
        if rivals and max(rivals) >= max(2, n - 1):
            continue
        if starved(by_metric):
            continue  # idle, not slow: the node's input (host, storage) is the suspect, which other rules judge
        recurring = one_sided[(unit, category)]
        if not recurring:
            continue  # beating on every metric that recurs
        if busier(recurring):
            continue  # moving more data than its peers, again and again: no fault's sign (demo, metric-only eval)
        if len(corroborated[unit]) < MIN_METRICS:
            continue
        findings.append(_finding(job, unit, category, recurring, latest_end, span_s, horizon_s))
    return findings


def _one_sided(by_metric: dict[tuple[str, str], list[Episode]]) -> dict[tuple[str, str], list[Episode]]:
    """The (metric, side)s recurring in MIN_EPISODES episodes or more, less any metric also standing apart on its
    other side in BEAT_EPISODES or more: a fault takes a GPU one way (slower, hotter, less traffic), while a GPU above
    its peers, then below, then above again is its samples beating against the steps (the 15-min demo's healthy
    node-003: all 8 GPUs' NVLink and PCIe bytes recurring both above and below their peers', evicted)."""
    other = {"high": "low", "low": "high"}
    return {
        (metric, side): eps
        for (metric, side), eps in by_metric.items()
        if len(eps) >= MIN_EPISODES and len(by_metric.get((metric, other[side]), ())) < BEAT_EPISODES
    }


def _signal(metric: str) -> str:
    """What a metric measures: a link's bytes sent, received and in total are one link's traffic (a step's bytes go out
    and come back), so they corroborate nothing of each other; any other metric is its own."""
    spec = _spec(metric)
    return f"{spec.category} traffic" if spec.counter else metric


def _finding(
    job: JobInfo,
    unit: str,
    category: str,
    recurring: dict[tuple[str, str], list[Episode]],
    latest_end: datetime,
    span_s: float,
    horizon_s: float,
) -> Finding:
    node, _, gpu = unit.rpartition("/")
    n = max(len(eps) for eps in recurring.values())
    # Weighted as the continuity rule weighs its metrics; a third episode keeps 90% of it, a fifth all of it.
    ordered = sorted(recurring.items(), key=lambda item: (-len(item[1]), -_spec(item[0][0]).weight))
    remaining = 1.0
    metrics: list[PeerMetric] = []
    for (metric, direction), eps in ordered:
        score = float(np.median([ep.peak.get("score", abs(ep.peak["z"])) for ep in eps]))
        remaining *= 1.0 - _spec(metric).weight * strength(score)
        metrics.append(
            {
                "metric": metric,
                "direction": direction,
                "score": round(score, 3),
                "windows_flagged": sum(ep.spans for ep in eps),
                "windows": [_window(ep, span_s) for ep in reversed(eps)],  # latest first, each episode's peak
            }
        )
    factor = EPISODE_FACTOR[min(n - MIN_EPISODES, len(EPISODE_FACTOR) - 1)]
    confidence = round(min(MAX_CONFIDENCE, (1.0 - remaining) * factor), 3)
    lead_metric, lead_direction = ordered[0][0]
    lead = ordered[0][1]
    episode_list: list[PeerEpisode] = [
        {
            "start": ep.start.isoformat(),
            "end": ep.last_end.isoformat(),
            "metric": ep.metric,
            "direction": ep.direction,
            "z": round(float(ep.peak["z"]), 3),
            "spans": ep.spans,
        }
        for _, eps in ordered
        for ep in eps
    ]
    evidence: PeerEvidence = {
        "signals": [
            {
                "type": "metric",
                "node": node,
                "gpu": int(gpu) if gpu.isdigit() else gpu,
                "metric": lead_metric,
                "from": ep.start.isoformat(),
                "to": ep.last_end.isoformat(),
            }
            for ep in lead
        ],
        "unit": unit,
        "job_id": job.job_id,
        "window_s": span_s,
        "rule": "recurrence",
        "horizon_s": horizon_s,
        "episodes": episode_list,
        "metrics": metrics,
        "supporting": [],
    }
    peak = max(lead, key=lambda ep: abs(ep.peak["z"])).peak
    gaps = [(b.start - a.last_end).total_seconds() for a, b in itertools.pairwise(lead)]
    names = ", ".join(m["metric"] for m in metrics)
    return Finding(
        detector=DETECTOR,
        category=category,
        subject_kind="gpu",
        subject=unit,
        confidence=confidence,
        summary=(
            f"{node} GPU {gpu} comes and goes as its peers' outlier: {len(lead)} episodes in {horizon_s / 60:.0f} min "
            f"({lead_direction} {lead_metric}: {_num(peak.get('value'))} vs peers {_num(peak.get('peer_median'))}), "
            f"normal for ~{_median_s(gaps)} between; metrics: {names}"
        ),
        # Its first flagged span's end, as the continuity rule dates (ml/peers.py): when it first stood apart.
        observed_at=lead[0].start + timedelta(seconds=span_s),
        node=node,
        blame="infrastructure",
        role="cause",
        action="evict",
        # By episodes and recurring metrics: a pass that sees more (a surer claim) stores a new finding, the same
        # claim again stores nothing (the first of a key is kept, so a key fixed at the first, weak pass would
        # hold a partial span's low confidence for good). The first episode's start tells a GPU recurring again
        # later in a weeks-long job from the claim already stored.
        key=f"{unit}:{category}:recurrent:{n}:{len(recurring)}:{lead[0].start:%Y%m%dT%H%M%S}",
        evidence=evidence,
    )


def _window(ep: Episode, span_s: float) -> PeerWindow:
    start = ep.peak_end - timedelta(seconds=span_s)
    return {
        "start": start.isoformat(),
        "end": ep.peak_end.isoformat(),
        **{k: round(v, 6) if isinstance(v, float) else v for k, v in ep.peak.items()},
    }


def _num(value: object) -> str:
    return significant(value, 4) if isinstance(value, int | float) else "?"


def _median_s(gaps: list[float]) -> str:
    return f"{float(np.median(gaps)):.0f} s" if gaps else "a while"
