"""Error-rate counters judged against the job's other GPUs (a rule family of ml/counters.py): NVLink CRC and
replay errors (and link recoveries), and PCIe replays.

Every GPU accumulates a few of these; one GPU whose counters rise far faster than the job's median is the
finding, one per node over its flagged GPUs. A service that passes only the GPUs worth a look supplies the
job-wide medians (PEER_MEDIANS).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pandas as pd

from ml.counter_findings import _dt, _gpu_finding, _signal, _stamp
from ml.counter_samples import _KEYS, _Samples, _span_minutes
from ml.findings import Finding, JobInfo
from ml.metrics import (
    NVLINK_CRC_DATA_ERRORS,
    NVLINK_CRC_FLIT_ERRORS,
    NVLINK_RECOVERY_ERRORS,
    NVLINK_REPLAY_ERRORS,
    PCIE_REPLAY,
)

NVLINK_ERRORS = (NVLINK_CRC_FLIT_ERRORS, NVLINK_CRC_DATA_ERRORS, NVLINK_REPLAY_ERRORS)

# Peer comparison of error-rate counters: at least this many new errors, and this many times the job's median.
NVLINK_MIN_ERRORS = 20.0
PCIE_MIN_REPLAYS = 10.0
PEER_FACTOR = 10.0
NVLINK_EVICT_PER_MIN = 100.0  # a link this bad is replaying constantly: the job crawls
PCIE_HIGH_PER_MIN = 100.0

# The job-wide medians a caller may supply: name -> the counter columns whose per-GPU increases are summed.
PEER_MEDIANS: dict[str, tuple[str, ...]] = {
    "nvlink": NVLINK_ERRORS,
    "nvlink_recovery": (NVLINK_RECOVERY_ERRORS,),
    "pcie": (PCIE_REPLAY,),
}


def _peer_outliers(
    samples: _Samples, columns: Sequence[str], min_errors: float, median: float | None = None
) -> tuple[pd.DataFrame, float]:
    """Per GPU: new errors summed over `columns` and per minute; the GPUs far above the job's median (`median`
    when the caller knows it from GPUs that are not in `df`)."""
    df = samples.df
    parts = [samples.increases(c).set_index(_KEYS)["increase"].rename(c) for c in columns if c in df.columns]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(), 0.0
    table = pd.concat(parts, axis=1).fillna(0.0)
    table["total"] = table.sum(axis=1)
    table["per_min"] = table["total"] / _span_minutes(df).reindex(table.index).fillna(1.0)
    if median is None:
        median = float(table["total"].median())
    outliers = table[(table["total"] >= min_errors) & (table["total"] >= PEER_FACTOR * (median + 1.0))]
    return outliers, median


def _nvlink(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """NVLink CRC/replay errors rising on one GPU far faster than on its peers, or link recoveries."""
    df = samples.df
    outliers, median = _peer_outliers(samples, NVLINK_ERRORS, NVLINK_MIN_ERRORS, medians.get("nvlink"))
    recovery = (
        samples.increases(NVLINK_RECOVERY_ERRORS).set_index(_KEYS)["increase"] if NVLINK_RECOVERY_ERRORS in df else None
    )
    flagged: dict[tuple[str, int], dict[str, Any]] = {}
    for (node, gpu), row in outliers.iterrows():
        flagged[(node, int(gpu))] = {"errors": float(row["total"]), "per_min": float(row["per_min"])}
    recovery_median = medians.get("nvlink_recovery")
    if recovery_median is None and recovery is not None and not recovery.empty:
        recovery_median = float(recovery.median())
    if recovery is not None and not recovery.empty and recovery_median == 0.0:
        for (node, gpu), value in recovery[recovery > 0].items():
            flagged.setdefault((node, int(gpu)), {"errors": 0.0, "per_min": 0.0})["recoveries"] = float(value)
    columns = (*NVLINK_ERRORS, NVLINK_RECOVERY_ERRORS)
    return _grouped_findings(
        flagged,
        _first_rise(samples, columns),
        _last_rise(samples, columns),
        key="nvlink",
        category="nvlink",
        what="NVLink errors",
        severe=lambda info: info["per_min"] >= NVLINK_EVICT_PER_MIN or info.get("recoveries", 0) > 0,
        confidence=lambda severe, rate: 0.8 if severe else 0.55,
        median=median,
    )


def _pcie(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """PCIe replays rising on one GPU far faster than on its peers: a marginal link or riser (diagnose)."""
    outliers, median = _peer_outliers(samples, (PCIE_REPLAY,), PCIE_MIN_REPLAYS, medians.get("pcie"))
    flagged = {
        (node, int(gpu)): {"errors": float(row["total"]), "per_min": float(row["per_min"])}
        for (node, gpu), row in outliers.iterrows()
    }
    return _grouped_findings(
        flagged,
        _first_rise(samples, (PCIE_REPLAY,)),
        _last_rise(samples, (PCIE_REPLAY,)),
        key=PCIE_REPLAY,
        category="pcie",
        what="PCIe replays",
        severe=lambda info: False,
        confidence=lambda severe, rate: 0.6 if rate >= PCIE_HIGH_PER_MIN else 0.5,
        median=median,
    )


def _first_rise(samples: _Samples, columns: Sequence[str]) -> dict[tuple[str, int], pd.Timestamp]:
    """Per GPU: the earliest first increase over `columns`."""
    return _rise(samples, columns, "first_ts", min)


def _last_rise(samples: _Samples, columns: Sequence[str]) -> dict[tuple[str, int], pd.Timestamp]:
    """Per GPU: the latest increase over `columns`."""
    return _rise(samples, columns, "last_ts", max)


def _rise(
    samples: _Samples, columns: Sequence[str], which: str, pick: Callable[[Any, Any], Any]
) -> dict[tuple[str, int], pd.Timestamp]:
    found: dict[tuple[str, int], pd.Timestamp] = {}
    for column in columns:
        if column not in samples.df.columns:
            continue
        inc = samples.increases(column)
        for _, row in inc[inc["increase"] > 0].iterrows():
            k = (row["node"], int(row["gpu"]))
            found[k] = pick(found[k], row[which]) if k in found else row[which]
    return found


def _grouped_findings(
    flagged: dict[tuple[str, int], dict[str, Any]],
    first_ts: dict[tuple[str, int], pd.Timestamp],
    last_ts: dict[tuple[str, int], pd.Timestamp],
    *,
    key: str,
    category: str,
    what: str,
    severe: Callable[[dict[str, Any]], bool],
    confidence: Callable[[bool, float], float],
    median: float,
) -> list[Finding]:
    """One finding per node over its flagged GPUs (several bad GPUs on one node point at the node)."""
    by_node: dict[str, list[int]] = {}
    for node, gpu in sorted(flagged):
        by_node.setdefault(node, []).append(gpu)
    findings = []
    for node, gpus in by_node.items():
        infos = [flagged[(node, g)] for g in gpus]
        bad = any(severe(info) for info in infos)
        first = min((first_ts[(node, g)] for g in gpus if (node, g) in first_ts), default=None)
        if first is None:
            continue
        errors = sum(info["errors"] for info in infos)
        rate = max(info["per_min"] for info in infos)
        where = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus}"
        findings.append(
            _gpu_finding(
                node,
                gpus,
                key=f"{key}:{node}/{'+'.join(map(str, gpus))}:{'evict' if bad else 'diagnose'}:{_stamp(first)}",
                # The window slides over a counter that keeps climbing: its first rise, GPUs and severity move,
                # the claim (this signature on this node) does not.
                series=f"{key}:{node}",
                seen_until=_dt(max((last_ts[(node, g)] for g in gpus if (node, g) in last_ts), default=first)),
                category=category,
                confidence=confidence(bad, rate),
                summary=f"{what} on {node} {where}: +{int(errors)} ({rate:.0f}/min) vs a job median of {median:.0f}",
                observed_at=_dt(first),
                action="evict" if bad else "diagnose",
                signals=[_signal(node, g, key, first_ts.get((node, g), first)) for g in gpus],
                errors=int(errors),
                per_minute=round(rate, 1),
                peer_median=median,
                recoveries=int(sum(info.get("recoveries", 0) for info in infos)) or None,
            )
        )
    return findings
