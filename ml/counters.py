"""GPU counters: uncorrectable memory errors, row-remap failures, Xids, NVLink and PCIe error rates, lost GPUs.

Input: a job's metric samples as a DataFrame (ts, node, gpu and one column per metric, named as in
ml/metrics.py). Counters are cumulative; only increases between consecutive samples of one GPU
count, so a counter reset (a GPU reset zeroes the volatile ECC counters) is never an increase. Error-rate
counters that every GPU accumulates a little (NVLink CRC, PCIe replays) are judged against the job's other
GPUs: one GPU rising far faster than its peers is the finding. A GPU whose samples stop while the other GPUs
of its node keep reporting has fallen off the bus; a silent node, or a job whose samples all end, is not that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import numpy as np
import pandas as pd

from ml.findings import CounterEvidence, Finding, JobInfo, SignalRef
from ml.metrics import (
    ECC_DBE_VOLATILE,
    GPU_UTIL,
    NVLINK_CRC_DATA_ERRORS,
    NVLINK_CRC_FLIT_ERRORS,
    NVLINK_RECOVERY_ERRORS,
    NVLINK_REPLAY_ERRORS,
    PCIE_LINK_GEN,
    PCIE_LINK_WIDTH,
    PCIE_MAX_LINK_GEN,
    PCIE_MAX_LINK_WIDTH,
    PCIE_REPLAY,
    REMAPPED_ROWS_UNCORRECTABLE,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    XID_LAST,
)
from ml.xid import lookup

DETECTOR = "counters"

# Uncorrectable-error counters: any increase means the GPU's memory is broken. column -> (confidence, words)
UNCORRECTABLE: dict[str, tuple[float, str]] = {
    ECC_DBE_VOLATILE: (0.93, "uncorrectable (double-bit) ECC errors"),
    REMAPPED_ROWS_UNCORRECTABLE: (0.85, "rows remapped after uncorrectable errors"),
}
NVLINK_ERRORS = (NVLINK_CRC_FLIT_ERRORS, NVLINK_CRC_DATA_ERRORS, NVLINK_REPLAY_ERRORS)

# Peer comparison of error-rate counters: at least this many new errors, and this many times the job's median.
NVLINK_MIN_ERRORS = 20.0
PCIE_MIN_REPLAYS = 10.0
PEER_FACTOR = 10.0
NVLINK_EVICT_PER_MIN = 100.0  # a link this bad is replaying constantly: the job crawls
PCIE_HIGH_PER_MIN = 100.0

# A PCIe link below its maximum must be seen this many samples in a row; a lower generation counts only while
# the GPU is busy, since an idle GPU lowers its link speed to save power (width does not change that way).
PCIE_LINK_SAMPLES = 3
PCIE_BUSY_UTIL = 50.0

# GPU states that ask for the GPU to go, column -> (confidence, summary): no spare rows left (replace it), or
# memory rows or pages the driver marked to retire at the next GPU reset (the repair is not active until then).
STATES: dict[str, tuple[float, str]] = {
    ROW_REMAP_FAILURE: (0.95, "row remapping failed on {node} GPU {gpu}: no spare memory rows left"),
    ROW_REMAP_PENDING: (
        0.85,
        "memory rows marked for remapping on {node} GPU {gpu}: the GPU needs a reset to activate the repair",
    ),
    RETIRED_PAGES_PENDING: (
        0.85,
        "memory pages marked for retirement on {node} GPU {gpu}: the GPU needs a reset to activate the repair",
    ),
}
PENDING = (ROW_REMAP_PENDING, RETIRED_PAGES_PENDING)

# A lost GPU: silent for this many of its node's sampling intervals (and this long), while the node reports.
# Samples of a GPU this far apart in the job's data: the machine was away from the job (evicted and in repair, or
# drained) and its counters' rise across the absence happened outside it (a repaired machine swapped back in was
# accused on the errors of the fault it had been evicted for). An agent's restart is a few seconds.
AWAY_S = 120.0
LOST_INTERVALS = 3
LOST_MIN_S = 10.0
LOST_MIN_LATER_SAMPLES = 2
FUTURE_SKEW = timedelta(minutes=5)  # samples stamped further ahead of `now` than this are clock errors

# The job-wide medians a caller may supply: name -> the counter columns whose per-GPU increases are summed.
PEER_MEDIANS: dict[str, tuple[str, ...]] = {
    "nvlink": NVLINK_ERRORS,
    "nvlink_recovery": (NVLINK_RECOVERY_ERRORS,),
    "pcie": (PCIE_REPLAY,),
}

_log = logging.getLogger(__name__)
_KEYS = ["node", "gpu"]
_AWAY = "_away"  # a column _prepare adds


def _prepare(metrics: Any, job: JobInfo, now: datetime) -> _Samples | None:
    """The samples sorted by node, GPU and time, with UTC times and integer GPUs; None when unreadable."""
    if not isinstance(metrics, pd.DataFrame) or metrics.empty:
        return None
    if not {"ts", "node", "gpu"} <= set(metrics.columns):
        return None
    df = metrics.copy()
    df["ts"] = pd.to_datetime(df["ts"], utc=True, errors="coerce")
    df["gpu"] = pd.to_numeric(df["gpu"], errors="coerce")
    df = df.dropna(subset=["ts", "node", "gpu"])
    df["gpu"] = df["gpu"].astype(int)
    df["node"] = df["node"].astype(str)
    now_ts = pd.Timestamp(now if now.tzinfo else now.replace(tzinfo=UTC))
    df = df[df["ts"] <= now_ts + FUTURE_SKEW]
    nodes = set(job.nodes)
    if nodes and df["node"].isin(nodes).any():
        df = df[df["node"].isin(nodes)]  # other machines' samples are not this job's business
    if df.empty:
        return None
    df = df.sort_values(["node", "gpu", "ts"], kind="stable").reset_index(drop=True)
    # Once for every counter: whether a sample follows its GPU's previous one after an absence from the job.
    df[_AWAY] = (df["ts"] - df.groupby(_KEYS)["ts"].shift()).dt.total_seconds() > AWAY_S
    return _Samples(df)


def _numeric(df: pd.DataFrame, column: str) -> pd.Series | None:
    if column not in df.columns:
        return None
    values = pd.to_numeric(df[column], errors="coerce")
    return None if values.notna().sum() == 0 else values


_INCREASE_COLUMNS = ["node", "gpu", "increase", "first_ts", "before", "after", "resets", "last_ts"]


class _Samples:
    """A job's prepared samples and, computed once per counter for all the rules that read it, the counter's
    increases per GPU (the rules ask for the same NVLink counters several times; each costs a grouped pass)."""

    def __init__(self, df: pd.DataFrame) -> None:
        self.df = df
        self._gpu = df.groupby(_KEYS, sort=False).ngroup()  # sorted by GPU: one integer per GPU, cheap to group
        self._keys = df.groupby(self._gpu, sort=True)[_KEYS].first()  # each integer's node and GPU
        self._cache: dict[str, pd.DataFrame] = {}

    def increases(self, column: str) -> pd.DataFrame:
        """Per GPU: the sum of increases between consecutive samples (resets, missing values and rises across an
        absence ignored), the time of the first and last increase, the values around the first and how many
        resets were seen."""
        if column not in self._cache:
            self._cache[column] = self._increases(column)
        return self._cache[column]

    def _increases(self, column: str) -> pd.DataFrame:
        df, gpu = self.df, self._gpu
        values = _numeric(df, column)
        if values is None:
            return pd.DataFrame(columns=_INCREASE_COLUMNS)
        filled = values.groupby(gpu).ffill()  # a missing sample does not break the chain of differences
        previous = filled.groupby(gpu).shift()
        delta = filled - previous
        rising = (delta > 0) & ~df[_AWAY]
        frame = pd.DataFrame(
            {
                "gpu_id": gpu,
                "ts": df["ts"],
                "inc": delta.where(rising, 0.0).fillna(0.0),
                "reset": (delta < 0).astype(int),
                "before": previous,
                "after": filled,
            }
        )
        out = frame.groupby("gpu_id", sort=True).agg(increase=("inc", "sum"), resets=("reset", "sum"))
        rises = frame[rising].groupby("gpu_id", sort=True)
        firsts = rises[["ts", "before", "after"]].first().rename(columns={"ts": "first_ts"})
        out = self._keys.join(out).join(firsts).join(rises["ts"].last().rename("last_ts"))
        return out.reset_index(drop=True)[_INCREASE_COLUMNS]


def _span_minutes(df: pd.DataFrame) -> pd.Series:
    """Per GPU: minutes between its first and last sample (at least one second)."""
    spans = df.groupby(_KEYS)["ts"].agg(["min", "max"])
    seconds = (spans["max"] - spans["min"]).dt.total_seconds().clip(lower=1.0)
    return seconds / 60.0


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


# --- rules ----------------------------------------------------------------------------------------------------


def _uncorrectable(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """Any increase of an uncorrectable-error counter: the GPU's memory is failing."""
    hits: dict[tuple[str, int], list[tuple[str, pd.Series]]] = {}
    for column in UNCORRECTABLE:
        inc = samples.increases(column)
        for _, row in inc[inc["increase"] > 0].iterrows():
            hits.setdefault((row["node"], int(row["gpu"])), []).append((column, row))
    findings = []
    for (node, gpu), rows in sorted(hits.items()):
        first = min(rows, key=lambda cr: cr[1]["first_ts"])
        confidence = max(UNCORRECTABLE[c][0] for c, _ in rows)
        words = ", ".join(f"{UNCORRECTABLE[c][1]} +{int(r['increase'])}" for c, r in rows)
        findings.append(
            _gpu_finding(
                node,
                [gpu],
                key=f"uncorrectable:{node}/{gpu}:{_stamp(first[1]['first_ts'])}",
                category="gpu_hardware",
                confidence=confidence,
                summary=f"{words} on {node} GPU {gpu}",
                observed_at=_dt(first[1]["first_ts"]),
                action="evict",
                signals=[_signal(node, gpu, c, r["first_ts"], r["before"], r["after"]) for c, r in rows],
                counters={c: int(r["increase"]) for c, r in rows},
            )
        )
    return findings


def _states(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """GPU states (not counters) that ask for the GPU to go: no spare rows left, or a repair waiting for a reset."""
    df = samples.df
    findings = []
    for column, (confidence, words) in STATES.items():
        values = _numeric(df, column)
        if values is None:
            continue
        for (node, gpu), rows in df[values > 0].groupby(_KEYS, sort=True):
            first = rows["ts"].min()
            findings.append(
                _gpu_finding(
                    node,
                    [int(gpu)],
                    key=f"{column}:{node}/{gpu}:{_stamp(first)}",
                    category="gpu_hardware",
                    confidence=confidence,
                    summary=words.format(node=node, gpu=gpu),
                    observed_at=_dt(first),
                    action="evict",
                    signals=[_signal(node, int(gpu), column, first, after=1)],
                )
            )
    return findings


def _xid_counter(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """DCGM's last-Xid field changing to a hardware Xid (the kernel log may not reach us)."""
    df = samples.df
    values = _numeric(df, XID_LAST)
    if values is None:
        return []
    keys = [df["node"], df["gpu"]]
    previous = values.groupby(keys).shift()
    changed = (values > 0) & previous.notna() & (values != previous)
    findings = []
    frame = pd.DataFrame({"node": df["node"], "gpu": df["gpu"], "ts": df["ts"], "code": values, "before": previous})
    for (node, gpu, code), rows in frame[changed].groupby(["node", "gpu", "code"], sort=True):
        entry = lookup(int(code))
        if entry.severity not in ("fatal", "hardware"):
            continue  # application-level codes need the log's context; the log rules judge them
        first = rows.iloc[0]
        findings.append(
            _gpu_finding(
                node,
                [int(gpu)],
                key=f"xid_counter:{node}/{gpu}:{int(code)}:{_stamp(first['ts'])}",
                category=entry.category,
                confidence=round(entry.confidence * 0.9, 3),  # no message to confirm the code
                summary=f"DCGM reports Xid {int(code)} ({entry.name}) on {node} GPU {gpu}",
                observed_at=_dt(first["ts"]),
                action=entry.action,
                signals=[_signal(node, int(gpu), XID_LAST, first["ts"], first["before"], code)],
                xid=int(code),
                mnemonic=entry.mnemonic or None,
                # The same Xid as the kernel's line: a reset of this GPU clears it when the catalog says so.
                gpu_reset_enough=entry.gpu_reset_enough or None,
            )
        )
    return findings


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


def _reporting(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that carry at least one metric value (a GPU in error may be listed with every value blank)."""
    metric_columns = [c for c in df.columns if c not in ("ts", "node", "gpu", "job_id", "extra", "node_id", _AWAY)]
    if not metric_columns:
        return df
    values = df[metric_columns].apply(pd.to_numeric, errors="coerce")
    return df[values.notna().any(axis=1)]


def _gpu_timing(rows: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: its last sample, its node's last sample and the node's typical sampling interval (median over
    the node's GPUs of each GPU's median gap: exporters may stamp a node's GPUs apart)."""
    keys = [rows["node"], rows["gpu"]]
    gaps = (rows["ts"] - rows["ts"].groupby(keys).shift()).dt.total_seconds()
    per_gpu = pd.DataFrame({"node": rows["node"], "gpu": rows["gpu"], "gap": gaps.where(gaps > 0), "ts": rows["ts"]})
    timing = per_gpu.groupby(_KEYS).agg(last=("ts", "max"), gap=("gap", "median")).reset_index()
    nodes = timing.groupby("node").agg(node_last=("last", "max"), interval=("gap", "median"), gpus=("gpu", "nunique"))
    return timing.merge(nodes, left_on="node", right_index=True)


def _lost_gpus(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """GPUs whose samples stopped while the other GPUs of their node kept reporting."""
    df = samples.df
    rows = _reporting(df)
    timing = _gpu_timing(rows)
    timing["silent"] = (timing["node_last"] - timing["last"]).dt.total_seconds()
    gap = (LOST_INTERVALS * timing["interval"]).clip(lower=LOST_MIN_S)
    candidates = timing[(timing["gpus"] >= 2) & timing["interval"].notna() & (timing["silent"] >= gap)]
    findings = []
    for _, c in candidates.iterrows():
        node, gpu, last = c["node"], int(c["gpu"]), c["last"]
        node_rows = rows[rows["node"] == node]
        later = int(node_rows.loc[(node_rows["gpu"] != gpu) & (node_rows["ts"] > last), "ts"].nunique())
        if later < LOST_MIN_LATER_SAMPLES:
            continue
        silent = float(c["silent"])
        findings.append(
            _gpu_finding(
                node,
                [gpu],
                key=f"gpu_lost:{node}/{gpu}:{_stamp(last)}",
                category="gpu_hardware",
                confidence=0.85,
                summary=f"GPU {gpu} on {node} stopped reporting {silent:.0f} s before its node's other GPUs did",
                observed_at=_dt(last),
                action="evict",
                signals=[_signal(node, gpu, "last_sample", last)],
                silent_s=round(silent, 1),
                node_interval_s=round(float(c["interval"]), 3),
                samples_since=later,
            )
        )
    return findings


def _at(df: pd.DataFrame, index: Any, column: str) -> float | None:
    return _num(df.at[index, column]) if column in df.columns else None


def _pcie_link(samples: _Samples, job: JobInfo, now: datetime, medians: Mapping[str, float]) -> list[Finding]:
    """A GPU whose PCIe link trained narrower or slower than it can, sample after sample: a silent slowdown."""
    df = samples.df
    width, max_width = _numeric(df, PCIE_LINK_WIDTH), _numeric(df, PCIE_MAX_LINK_WIDTH)
    gen, max_gen = _numeric(df, PCIE_LINK_GEN), _numeric(df, PCIE_MAX_LINK_GEN)
    if width is None and gen is None:
        return []
    narrow = (width < max_width) if width is not None and max_width is not None else pd.Series(False, index=df.index)
    slow = pd.Series(False, index=df.index)
    if gen is not None and max_gen is not None:
        util = _numeric(df, GPU_UTIL)
        busy = util >= PCIE_BUSY_UTIL if util is not None else pd.Series(False, index=df.index)
        slow = (gen < max_gen) & busy
    frame = pd.DataFrame({"node": df["node"], "gpu": df["gpu"], "ts": df["ts"], "down": narrow | slow})
    findings = []
    for (node, gpu), rows in frame.groupby(_KEYS, sort=True):
        recent = rows.tail(PCIE_LINK_SAMPLES)
        if len(recent) < PCIE_LINK_SAMPLES or not recent["down"].all():
            continue
        index = recent.index[-1]
        now_w, top_w = _at(df, index, PCIE_LINK_WIDTH), _at(df, index, PCIE_MAX_LINK_WIDTH)
        now_g, top_g = _at(df, index, PCIE_LINK_GEN), _at(df, index, PCIE_MAX_LINK_GEN)
        link = f"gen {now_g:g} x{now_w:g}" if now_g is not None and now_w is not None else "a lower speed"
        best = f"gen {top_g:g} x{top_w:g}" if top_g is not None and top_w is not None else "its maximum"
        first = recent["ts"].iloc[0]
        findings.append(
            _gpu_finding(
                node,
                [int(gpu)],
                key=f"pcie_link:{node}/{gpu}:{_stamp(first)}",
                category="pcie",
                confidence=0.85,
                summary=f"GPU {gpu} on {node}: PCIe link at {link}, below {best}",
                observed_at=_dt(first),
                action="evict",
                signals=[
                    _signal(node, int(gpu), PCIE_LINK_WIDTH, recent["ts"].iloc[-1], top_w, now_w),
                    _signal(node, int(gpu), PCIE_LINK_GEN, recent["ts"].iloc[-1], top_g, now_g),
                ],
            )
        )
    return findings


_RULES = (
    _uncorrectable,
    _states,
    _xid_counter,
    _nvlink,
    _pcie,
    _pcie_link,
    _lost_gpus,
)


def detect(
    job: JobInfo, metrics: pd.DataFrame, *, now: datetime, peer_medians: Mapping[str, float] | None = None
) -> list[Finding]:
    """Findings from a job's GPU counters (cumulative columns are differenced per GPU). A service that passes
    only the GPUs worth a look (and their nodes) gives the job-wide medians of per-GPU new errors in
    `peer_medians` ("nvlink", "nvlink_recovery", "pcie"); see PEER_MEDIANS."""
    try:
        samples = _prepare(metrics, job, now)
    except Exception:
        _log.warning("counters: cannot read the metrics", exc_info=True)
        return []
    if samples is None:
        return []
    findings: list[Finding] = []
    for rule in _RULES:
        try:
            findings += rule(samples, job, now, peer_medians or {})
        except Exception:  # one rule's bug must not hide the others' findings
            _log.warning("counters rule %s failed", rule.__name__, exc_info=True)
    return findings
