"""Training metrics: a NaN or a 5x jump of loss or grad norm (from the agent's step and anomaly events).

Such an anomaly is a job incident (the data, the learning rate, the code) and blames the user's side, unless
the evidence names a machine: when only one node's ranks report a NaN (or a spike) for a step at which other
nodes report finite, ordinary values, that node is the suspect (silent data corruption on a GPU) and gets a
diagnosis. A NaN that persists is more certain, and more urgent, than one spike that recovers.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from ml.findings import Finding, JobInfo, LogRecord, TrainingMetricsEvidence

DETECTOR = "training_metrics"
METRICS = ("loss", "grad_norm")
PERSISTENT_STEPS = 3  # anomalous steps that make an anomaly persistent rather than isolated
NEARBY = timedelta(seconds=120)  # how close in time a finite report must be to vouch for a step-less NaN
MAX_SIGNALS = 50
MAX_LINES = 3
LINE_CHARS = 500

_NAN_KINDS = {"nan_loss": "loss", "grad_norm_nan": "grad_norm"}
_SPIKE_KINDS = {"loss_spike": "loss", "grad_norm_spike": "grad_norm"}
_LABEL = {"loss": "loss", "grad_norm": "grad norm"}

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Obs:
    """One value of one metric as one record reports it."""

    record: LogRecord
    node: str
    rank: int | None
    metric: str
    step: int | None
    value: float | None  # None: the record says "NaN" without a number
    anomaly: str | None  # "nan", "spike" or None for an ordinary value

    @property
    def ts(self) -> datetime:
        ts = self.record.ts
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _number(value: Any) -> float | None:
    """A float from a wire value: numbers, and "nan"/"inf"/"-inf" as JSON carries them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _observations(records: Iterable[LogRecord]) -> list[_Obs]:
    """Every metric value and anomaly the records report; blocks wrapping a NaN error count as one."""
    out: list[_Obs] = []
    for r in records:
        if not isinstance(r, LogRecord) or not isinstance(r.ts, datetime):
            continue
        fields: Mapping[str, Any] = r.fields if isinstance(r.fields, Mapping) else {}
        kind = r.kind
        error = fields.get("error")
        if kind in ("traceback", "crash", "child_failed") and isinstance(error, Mapping):
            kind, fields = str(error.get("kind") or ""), error
        rank = _int(r.rank)
        step = _int(fields.get("step"))
        if kind == "step":
            for metric in METRICS:
                value = _number(fields.get(metric))
                if value is not None:
                    anomaly = None if math.isfinite(value) else "nan"
                    out.append(_Obs(r, r.node, rank, metric, step, value, anomaly))
        elif kind in _NAN_KINDS:
            metric = _NAN_KINDS[kind]
            out.append(_Obs(r, r.node, rank, metric, step, _number(fields.get(metric)), "nan"))
        elif kind == "loss_scale_overflow" and fields.get("at_minimum") is True:
            # fp16 overflow at the smallest loss scale: the step's gradients are inf/NaN and cannot be scaled away
            out.append(_Obs(r, r.node, rank, "grad_norm", step, None, "nan"))
        elif kind in _SPIKE_KINDS:
            metric = _SPIKE_KINDS[kind]
            out.append(_Obs(r, r.node, rank, metric, step, _number(fields.get(metric)), "spike"))
    return out


def _vouched(anomalies: Sequence[_Obs], normal: Sequence[_Obs]) -> bool:
    """Whether other nodes report ordinary values where the anomalous ones do (same step, or nearby in time)."""
    bad_nodes = {o.node for o in anomalies}
    others = [o for o in normal if o.node not in bad_nodes]
    if not others:
        return False
    steps = {o.step for o in others if o.step is not None}
    for o in anomalies:
        if o.step is not None and o.step in steps:
            return True
        if o.step is None and any(abs(x.ts - o.ts) <= NEARBY for x in others):
            return True
    return False


def _distinct_steps(obs: Sequence[_Obs]) -> int:
    """Anomalous steps counted once however many ranks report them; step-less reports count by second."""
    return len({o.step if o.step is not None else o.ts.replace(microsecond=0) for o in obs})


def _recovered(metric_obs: Sequence[_Obs], anomalies: Sequence[_Obs]) -> bool:
    """Ordinary values after the last anomaly, from the nodes that reported it."""
    nodes = {o.node for o in anomalies}
    last = max(anomalies, key=lambda o: (o.ts, o.step or -1))
    return any(
        o.anomaly is None
        and o.node in nodes
        and ((o.step is not None and last.step is not None and o.step > last.step) or o.ts > last.ts)
        for o in metric_obs
    )


def _clip(text: str, limit: int = LINE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _evidence(obs: Sequence[_Obs], **extra: Any) -> TrainingMetricsEvidence:
    ordered = sorted(obs, key=lambda o: (o.ts, o.record.id))
    ids: list[int] = []
    for o in ordered:
        if o.record.id not in ids and len(ids) < MAX_SIGNALS:
            ids.append(o.record.id)
    lines: list[str] = []
    for o in ordered:
        line = _clip(o.record.line or "")
        if line not in lines and len(lines) < MAX_LINES:
            lines.append(line)
    steps = sorted({o.step for o in obs if o.step is not None})
    evidence: TrainingMetricsEvidence = {
        "signals": [{"type": "log", "id": i} for i in ids],
        "signature": "",
        "lines": lines,
        "count": len({o.record.id for o in obs}),
        "nodes": sorted({o.node for o in obs}),
        "ranks": sorted({o.rank for o in obs if o.rank is not None}),
        "steps": steps[:20],
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
    }
    evidence.update(cast(TrainingMetricsEvidence, {k: v for k, v in extra.items() if v is not None}))
    return evidence


def _finding_for(job: JobInfo, metric: str, kind: str, anomalies: list[_Obs], metric_obs: list[_Obs]) -> Finding:
    """One anomaly of one metric: node-level when other nodes vouch for the step, else job-level."""
    label = _LABEL[metric]
    nodes = sorted({o.node for o in anomalies})
    normal = [o for o in metric_obs if o.anomaly is None]
    steps = _distinct_steps(anomalies)
    recovered = _recovered(metric_obs, anomalies)
    persistent = steps >= PERSISTENT_STEPS or not recovered
    first = min(anomalies, key=lambda o: (o.ts, o.record.id))
    at = f" at step {first.step}" if first.step is not None else ""
    what = "NaN/inf" if kind == "nan" else "a 5x jump"
    localized = len(nodes) == 1 and _vouched(anomalies, normal)
    if kind == "nan":
        confidence = 0.85 if persistent else 0.5
        action = "rollback" if persistent else "none"
    else:
        confidence = 0.6 if persistent else 0.35
        action = "none"
    if localized:
        node = nodes[0]
        summary = f"{label} {what}{at} on {node} only, while other nodes report ordinary values"
        confidence = min(0.7, confidence)
        return _make(job, metric, kind, anomalies, summary, confidence, node, "unknown", "diagnose", persistent)
    duration = f" for {steps} steps" if steps > 1 else ""
    tail = "" if persistent else " (recovered)"
    summary = f"{label} {what}{at}{duration}{tail}"
    return _make(job, metric, kind, anomalies, summary, confidence, None, "user_code", action, persistent)


def _make(
    job: JobInfo,
    metric: str,
    kind: str,
    anomalies: list[_Obs],
    summary: str,
    confidence: float,
    node: str | None,
    blame: str,
    action: str,
    persistent: bool,
) -> Finding:
    values = [o.value for o in anomalies if o.value is not None and math.isfinite(o.value)]
    evidence = _evidence(
        anomalies,
        metric=metric,
        anomaly=kind,
        persistent=persistent,
        max_value=max(values) if values else None,
        factors=sorted({f for o in anomalies if isinstance(f := o.record.fields.get("factor"), int | float)})[:10]
        or None,
    )
    evidence["signature"] = f"{kind}:{metric}"
    return Finding(
        detector=DETECTOR,
        category="nan",
        subject_kind="node" if node else "job",
        subject=node or job.job_id,
        confidence=round(confidence, 3),
        summary=summary[:300],
        observed_at=min(o.ts for o in anomalies),
        node=node,
        blame=blame,
        role="cause",
        action=action,
        # The claim and its episode: a NaN after a restart, or one that turned persistent, is a new finding.
        key=f"{kind}:{node or 'job'}:{metric}:{action}@{min(o.ts for o in anomalies):%Y%m%dT%H%M%S}",
        # The window slides over a run of bad steps: its first step moves, the claim does not (one row, moved).
        series=f"{kind}:{node or 'job'}:{metric}",
        seen_until=max(o.ts for o in anomalies),
        evidence=evidence,
    )


def detect(job: JobInfo, records: list[LogRecord]) -> list[Finding]:
    """NaN and spike findings from a job's step and anomaly events."""
    try:
        obs = _observations(records or [])
    except Exception:
        _log.warning("training_metrics: cannot read the records", exc_info=True)
        return []
    by_metric: dict[str, list[_Obs]] = defaultdict(list)
    for o in obs:
        by_metric[o.metric].append(o)
    findings: list[Finding] = []
    for metric in METRICS:
        metric_obs = by_metric.get(metric, [])
        nans = [o for o in metric_obs if o.anomaly == "nan"]
        spikes = [o for o in metric_obs if o.anomaly == "spike"]
        try:
            if nans:
                findings.append(_finding_for(job, metric, "nan", nans, metric_obs))
            if spikes:
                findings.append(_finding_for(job, metric, "spike", spikes, metric_obs))
        except Exception:  # odd values must not hide the other metric's finding
            _log.warning("training_metrics: %s failed", metric, exc_info=True)
    return findings
