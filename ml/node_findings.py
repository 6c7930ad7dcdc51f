"""The finding a node_signals rule writes (ml/node_signals.py): its key and series, and its evidence's refs.

A state that persists (a port down, a slow link, errors, congestion, memory pressure) is one series that each
pass moves; a flap is a finding of its own, keyed by its time.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from ml.evidence import NodeSignalEvidence, SignalRef
from ml.findings import Finding

DETECTOR = "node_signals"


def _port_name(subject: str) -> str:
    kind, _, name = subject.partition(":")
    return f"{'InfiniBand' if kind == 'ib' else 'RoCE' if kind == 'roce' else 'Ethernet'} port {name}"


def _iso(ts: Any) -> str:
    return pd.Timestamp(ts).isoformat()


def _dt(ts: Any) -> datetime:
    stamp = pd.Timestamp(ts)
    return (stamp.tz_localize(UTC) if stamp.tzinfo is None else stamp).to_pydatetime()


def _ref(node: str, subject: str, column: str, ts: Any, value: float | None = None) -> SignalRef:
    ref: SignalRef = {"type": "node_metric", "node": node, "subject": subject, "metric": column, "ts": _iso(ts)}
    if value is not None and math.isfinite(value):
        ref["value"] = round(value, 3)
    return ref


def _finding(
    node: str,
    subject: str,
    rule: str,
    *,
    category: str,
    confidence: float,
    action: str,
    summary: str,
    at: Any,
    evidence: NodeSignalEvidence,
    blame: str = "infrastructure",
    key_at: Any | None = None,
) -> Finding:
    stamp = pd.Timestamp(key_at if key_at is not None else at)
    # A state that persists (`key_at`: the start of the windows it was seen in, which slide every pass) is one
    # series: each pass moves its one row (latest figures, last seen) rather than adding a near-identical one.
    persists = key_at is not None
    return Finding(
        detector=DETECTOR,
        category=category,
        subject_kind="node",
        subject=node,
        confidence=confidence,
        summary=summary,
        observed_at=_dt(at),
        node=node,
        blame=blame,
        action=action,
        key=f"{rule}:{node}:{subject}:{stamp.strftime('%Y%m%dT%H%M%S')}",
        series=f"{rule}:{node}:{subject}" if persists else "",
        seen_until=_dt(at) if persists else None,
        evidence={**evidence, "rule": rule, "subject": subject},
    )
