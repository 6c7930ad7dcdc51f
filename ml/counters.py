"""GPU counters: uncorrectable memory errors, row-remap failures, Xids, NVLink and PCIe error rates, lost GPUs.

Input: a job's metric samples as a DataFrame (ts, node, gpu and one column per metric, named as in
ml/metrics.py). Counters are cumulative; only increases between consecutive samples of one GPU
count, so a counter reset (a GPU reset zeroes the volatile ECC counters) is never an increase. Error-rate
counters that every GPU accumulates a little (NVLink CRC, PCIe replays) are judged against the job's other
GPUs: one GPU rising far faster than its peers is the finding. A GPU whose samples stop while the other GPUs
of its node keep reporting has fallen off the bus; a silent node, or a job whose samples all end, is not that.

The samples are prepared in ml/counter_samples.py, the error rates compared with the peers' in ml/error_rates.py,
and every rule's finding is written by ml/counter_findings.py; the other rules (uncorrectable errors, GPU states,
Xids, a PCIe link below its best, lost GPUs) and detect, which runs them all, live here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pandas as pd

from ml.counter_findings import _dt, _gpu_finding, _num, _signal, _stamp
from ml.counter_samples import _AWAY, _KEYS, _numeric, _prepare, _Samples
from ml.error_rates import _nvlink, _pcie
from ml.findings import Finding, JobInfo
from ml.metrics import (
    ECC_DBE_VOLATILE,
    GPU_UTIL,
    PCIE_LINK_GEN,
    PCIE_LINK_WIDTH,
    PCIE_MAX_LINK_GEN,
    PCIE_MAX_LINK_WIDTH,
    REMAPPED_ROWS_UNCORRECTABLE,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    XID_LAST,
)
from ml.xid import lookup

# Uncorrectable-error counters: any increase means the GPU's memory is broken. column -> (confidence, words)
UNCORRECTABLE: dict[str, tuple[float, str]] = {
    ECC_DBE_VOLATILE: (0.93, "uncorrectable (double-bit) ECC errors"),
    REMAPPED_ROWS_UNCORRECTABLE: (0.85, "rows remapped after uncorrectable errors"),
}

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
LOST_INTERVALS = 3
LOST_MIN_S = 10.0
LOST_MIN_LATER_SAMPLES = 2

_log = logging.getLogger(__name__)


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
                    last_at=_dt(rows["ts"].max()).isoformat(),
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
    `peer_medians` ("nvlink", "nvlink_recovery", "pcie"); see ml/error_rates.py's PEER_MEDIANS."""
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
