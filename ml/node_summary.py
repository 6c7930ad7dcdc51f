"""The job-wide summary of a job's node windows: what ml/node_signals.py's rules compare a machine with.

The service computes the same in SQL (service/diagnosis/metric_passes.py), and a test holds the two to the same
findings. Per machine and subject (ends, aggregate_ends): the counters' rises and spans, from the four windows a
summary reads (summary_windows), and the last window's gauges. Per subject (peer_summary): the job's machines,
the share with the port ACTIVE and the medians the rules judge against. worth_a_look: the machines a rule could
fire on, whose windows alone the service then reads; the thresholds it shares with the rules are defined here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from ml.metrics import WINDOW_S
from ml.node_metrics import (
    EDAC_UE,
    EXCESSIVE_BUFFER_OVERRUN_ERRORS,
    HOST,
    LINK_DOWNED,
    LINK_ERROR_RECOVERY,
    LOCAL_LINK_INTEGRITY_ERRORS,
    MEM_AVAILABLE_MIB,
    MEM_TOTAL_MIB,
    PAUSE_RX_FRAMES,
    PAUSE_TX_FRAMES,
    PORT_ACTIVE,
    PORT_RATE_GBPS,
    PORT_RCV_ERRORS,
    PORT_STATE,
    PORT_XMIT_DISCARDS,
    PORT_XMIT_WAIT,
    PSI_MEM_FULL,
    PSI_MEM_SOME,
    SYMBOL_ERROR,
)

PORT_ERRORS = (
    SYMBOL_ERROR,
    LINK_ERROR_RECOVERY,
    PORT_RCV_ERRORS,
    LOCAL_LINK_INTEGRITY_ERRORS,
    EXCESSIVE_BUFFER_OVERRUN_ERRORS,
    PORT_XMIT_DISCARDS,
)
CONGESTION = (PORT_XMIT_WAIT, PAUSE_TX_FRAMES, PAUSE_RX_FRAMES)

# The thresholds worth_a_look shares with the rules (it names a superset of the machines they fire on).
RATE_DROP = 0.9  # a port below this fraction of its peers' rate trained slower
ERRORS_MIN = 50.0  # new link errors in the lookback before a port's errors are worth a claim
ERRORS_FACTOR = 10.0
CONGESTION_FACTOR = 5.0  # a machine waiting or pausing this many times its peers' median
CONGESTION_FLOOR_PER_S = {PORT_XMIT_WAIT: 1000.0, PAUSE_TX_FRAMES: 50.0, PAUSE_RX_FRAMES: 50.0}
CONTINUITY_S = 120.0
LOOKBACK_S = 300.0  # the diagnosis pass's lookback (the service's diagnosis_window_s default)
PSI_FULL_HIGH = 5.0  # % of the last 10 s all non-idle tasks stalled on memory
PSI_SOME_HIGH = 20.0
AVAILABLE_LOW = 0.03


# The windows a summary reads (window starts): the lookback's first, the continuity period's first, the last two.
# Four windows however long the lookback, so the job-wide summary costs the same every pass; a flap or a drop
# is seen while it is among the last two windows, and its machine's windows are then read whole.
# EDAC's uncorrected memory errors: any rise is worth a look (ml/node_signals.py's _memory_errors).
LOOKBACK_RISES = (LINK_DOWNED, *PORT_ERRORS, EDAC_UE)
ENDS_COLUMNS = (
    "node",
    "subject",
    "first_ts",
    "continuity_ts",
    "last_ts",
    *(f"{end}_{c}" for c in LOOKBACK_RISES for end in ("first", "continuity", "last")),
    *(f"{end}_{c}" for c in CONGESTION for end in ("continuity", "last")),
    "down_lately",  # the port's state below ACTIVE in one of the last two windows
    PORT_STATE,  # the last window's
    PORT_RATE_GBPS,
    PSI_MEM_SOME,
    PSI_MEM_FULL,
    "available_share",  # MemAvailable / MemTotal
)
AGGREGATE_COLUMNS = (
    "node",
    "subject",
    "span_s",
    "continuity_span_s",
    *(f"rise_{c}" for c in (*LOOKBACK_RISES, *CONGESTION)),
    "down_lately",
    PORT_STATE,
    PORT_RATE_GBPS,
    PSI_MEM_SOME,
    PSI_MEM_FULL,
    "available_share",
)


def summary_windows(last: datetime, lookback_s: float = LOOKBACK_S) -> dict[str, datetime]:
    """The window starts a summary reads, for the newest closed window starting at `last`."""
    return {
        "first": last - timedelta(seconds=lookback_s - WINDOW_S),
        "continuity": last - timedelta(seconds=CONTINUITY_S - WINDOW_S),
        "previous": last - timedelta(seconds=WINDOW_S),
        "last": last,
    }


def ends(frame: pd.DataFrame) -> pd.DataFrame:
    """ENDS_COLUMNS from windows (the service reads the same from SQL): each machine's values at the summary's
    windows."""
    at = summary_windows(frame["window_start"].max().to_pydatetime())
    rows = []
    for (node, subject), g in frame.groupby(["node", "subject"]):
        by_start = g.set_index("window_start")
        value = functools.partial(_value_at, by_start, at)
        out: dict[str, Any] = {"node": node, "subject": subject}
        for when in ("first", "continuity", "last"):
            stamp = pd.Timestamp(at[when])
            out[f"{when}_ts"] = by_start.at[stamp, "last_ts"] if stamp in by_start.index else pd.NaT
        for c in LOOKBACK_RISES:
            out[f"first_{c}"], out[f"last_{c}"] = value("first", f"{c}_max"), value("last", f"{c}_max")
            out[f"continuity_{c}"] = value("continuity", f"{c}_max")
        for c in CONGESTION:
            out[f"continuity_{c}"], out[f"last_{c}"] = value("continuity", f"{c}_max"), value("last", f"{c}_max")
        out["down_lately"] = bool(min(value("previous", PORT_STATE), value("last", PORT_STATE)) < PORT_ACTIVE)
        for c in (PORT_STATE, PORT_RATE_GBPS, PSI_MEM_SOME, PSI_MEM_FULL):
            out[c] = value("last", c)
        out["available_share"] = value("last", MEM_AVAILABLE_MIB) / value("last", MEM_TOTAL_MIB)
        rows.append(out)
    return pd.DataFrame(rows, columns=list(ENDS_COLUMNS))


def _value_at(by_start: pd.DataFrame, at: Mapping[str, datetime], when: str, column: str) -> float:
    stamp = pd.Timestamp(at[when])
    if stamp not in by_start.index or column not in by_start.columns:
        return math.nan
    return float(by_start.at[stamp, column])


def _rise(first: pd.Series, last: pd.Series) -> pd.Series:
    """last - first; a counter that went down was reset, and what it holds now is its rise since."""
    first, last = pd.to_numeric(first, errors="coerce"), pd.to_numeric(last, errors="coerce")
    # Unknown (NaN) where either end is: no window there yet, or a counter the driver lacks. Not the counter's
    # whole value, which would read as a burst of errors on every machine that joined late.
    return (last - first).where(last >= first, last).where(first.notna() & last.notna())


def _seconds(first: pd.Series, last: pd.Series) -> pd.Series:
    first, last = pd.to_datetime(first, utc=True, errors="coerce"), pd.to_datetime(last, utc=True, errors="coerce")
    return (last - first).dt.total_seconds().fillna(WINDOW_S).clip(lower=WINDOW_S)


def aggregate_ends(table: pd.DataFrame) -> pd.DataFrame:
    """Per machine and subject: counter rises and spans (AGGREGATE_COLUMNS) from its ends."""
    if table is None or table.empty:
        return pd.DataFrame(columns=list(AGGREGATE_COLUMNS))
    out = table[["node", "subject"]].copy()
    # A machine younger than the lookback (a new job, a late joiner) is judged from the continuity period on.
    young = pd.to_datetime(table["first_ts"], utc=True, errors="coerce").isna()
    first_ts = table["first_ts"].where(~young, table["continuity_ts"])
    out["span_s"] = _seconds(first_ts, table["last_ts"])
    out["continuity_span_s"] = _seconds(table["continuity_ts"], table["last_ts"])
    for c in LOOKBACK_RISES:
        first = table[f"first_{c}"].where(~young, table[f"continuity_{c}"])
        out[f"rise_{c}"] = _rise(first, table[f"last_{c}"])
    for c in CONGESTION:
        out[f"rise_{c}"] = _rise(table[f"continuity_{c}"], table[f"last_{c}"])
    out["down_lately"] = table["down_lately"].fillna(False).astype(bool)
    for c in (PORT_STATE, PORT_RATE_GBPS, PSI_MEM_SOME, PSI_MEM_FULL, "available_share"):
        out[c] = pd.to_numeric(table[c], errors="coerce").astype("float64")
    return out[list(AGGREGATE_COLUMNS)]


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """AGGREGATE_COLUMNS from a whole job's windows."""
    return aggregate_ends(ends(frame))


def peer_summary(aggregates: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per subject, the job's machines: how many, the share with the port ACTIVE, the median rate and PSI, and
    each counter's median rise per second."""
    out: dict[str, dict[str, float]] = {}
    if aggregates is None or aggregates.empty:
        return out
    for subject, rows in aggregates.groupby("subject"):
        summary: dict[str, float] = {"n": float(rows["node"].nunique())}
        state = pd.to_numeric(rows[PORT_STATE], errors="coerce")
        summary["active_share"] = float((state >= PORT_ACTIVE).mean())
        summary[PORT_RATE_GBPS] = _median(rows[PORT_RATE_GBPS])
        summary[PSI_MEM_SOME] = _median(rows[PSI_MEM_SOME])
        span = pd.to_numeric(rows["span_s"], errors="coerce").clip(lower=WINDOW_S)
        recent_span = pd.to_numeric(rows["continuity_span_s"], errors="coerce").clip(lower=WINDOW_S)
        for c in PORT_ERRORS:
            summary[c] = _median(pd.to_numeric(rows[f"rise_{c}"], errors="coerce") / span)
        for c in CONGESTION:
            summary[c] = _median(pd.to_numeric(rows[f"rise_{c}"], errors="coerce") / recent_span)
        out[str(subject)] = summary
    return out


def _median(values: pd.Series) -> float:
    clean = pd.to_numeric(values, errors="coerce").dropna()
    return float(clean.median()) if not clean.empty else math.nan


def worth_a_look(aggregates: pd.DataFrame, peers: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The machines a rule could fire on (a superset): the service reads only their windows. Vectorized: at
    16,384 GPUs this judges about 18,000 rows every pass."""
    if aggregates is None or aggregates.empty:
        return []
    a = aggregates.reset_index(drop=True)
    peer = pd.DataFrame.from_dict({k: dict(v) for k, v in peers.items()}, orient="index")
    peer = peer.reindex(a["subject"].astype(str).to_numpy()).reset_index(drop=True)

    def own(column: str) -> pd.Series:
        return pd.to_numeric(a[column], errors="coerce").astype("float64")

    def theirs(column: str) -> pd.Series:
        values = peer[column] if column in peer.columns else pd.Series(math.nan, index=a.index)
        return pd.to_numeric(values, errors="coerce").astype("float64")

    span = own("span_s").fillna(WINDOW_S).clip(lower=WINDOW_S)
    recent_span = own("continuity_span_s").fillna(WINDOW_S).clip(lower=WINDOW_S)
    errors = sum((own(f"rise_{c}").fillna(0.0) for c in PORT_ERRORS), pd.Series(0.0, index=a.index))
    peer_errors = sum((theirs(c).fillna(0.0) for c in PORT_ERRORS), pd.Series(0.0, index=a.index)) * span
    congested = pd.Series(False, index=a.index)
    for c in CONGESTION:
        bar = (CONGESTION_FACTOR * theirs(c).fillna(0.0)).clip(lower=CONGESTION_FLOOR_PER_S[c])
        congested |= own(f"rise_{c}").fillna(0.0) / recent_span >= bar
    pressed = (a["subject"] == HOST) & (
        (own(PSI_MEM_SOME) >= PSI_SOME_HIGH)
        | (own(PSI_MEM_FULL) >= PSI_FULL_HIGH)
        | (own("available_share") <= AVAILABLE_LOW)
    )
    worth = (
        (own(f"rise_{LINK_DOWNED}").fillna(0.0) > 0)
        | (own(f"rise_{EDAC_UE}").fillna(0.0) > 0)
        | a["down_lately"].fillna(False).astype(bool)
        | (own(PORT_RATE_GBPS) < RATE_DROP * theirs(PORT_RATE_GBPS))
        | ((errors >= ERRORS_MIN) & (errors >= ERRORS_FACTOR * peer_errors.clip(lower=1.0)))
        | congested
        | pressed
    )
    return sorted({str(n) for n in a.loc[worth, "node"]})
