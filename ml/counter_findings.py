"""The finding a counters rule writes (ml/counters.py, ml/error_rates.py): one GPU's, or one node's over
several of its GPUs, with the metric refs its evidence lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import numpy as np
import pandas as pd

from ml.findings import CounterEvidence, Finding, SignalRef

DETECTOR = "counters"


def _iso(ts: Any) -> str | None:
    if ts is None or (isinstance(ts, float) and np.isnan(ts)) or pd.isna(ts):
        return None
    return pd.Timestamp(ts).to_pydatetime().isoformat()


def _dt(ts: Any) -> datetime:
    return pd.Timestamp(ts).to_pydatetime()


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(out) else out


def _signal(node: str, gpu: int, column: str, ts: Any, before: Any = None, after: Any = None) -> SignalRef:
    signal: SignalRef = {"type": "metric", "node": node, "gpu": int(gpu), "metric": column, "ts": _iso(ts)}
    if _num(before) is not None:
        signal["from"] = _num(before)
    if _num(after) is not None:
        signal["to"] = _num(after)
    return signal


def _gpu_finding(
    node: str,
    gpus: Sequence[int],
    *,
    key: str,
    category: str,
    confidence: float,
    summary: str,
    observed_at: datetime,
    action: str,
    signals: list[SignalRef],
    series: str = "",
    seen_until: datetime | None = None,
    **extra: Any,
) -> Finding:
    one = len(gpus) == 1
    evidence: CounterEvidence = {
        "signals": signals[:50],
        "signature": key.split(":", 1)[0],
        "count": len(signals),
        "gpus": sorted(int(g) for g in gpus),
    }
    evidence.update(cast(CounterEvidence, {k: v for k, v in extra.items() if v is not None}))  # the rule's details
    return Finding(
        detector=DETECTOR,
        category=category,
        subject_kind="gpu" if one else "node",
        subject=f"{node}/{gpus[0]}" if one else node,
        confidence=round(confidence, 3),
        summary=summary[:300],
        observed_at=observed_at,
        node=node,
        blame="infrastructure",
        role="cause",
        action=action,
        key=key,
        series=series,
        seen_until=seen_until,
        evidence=evidence,
    )


def _stamp(ts: Any) -> str:
    return pd.Timestamp(ts).strftime("%Y%m%dT%H%M%S")
