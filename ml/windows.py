"""Window aggregates of GPU metric samples: the compact shape detectors read at cluster scale.

A window frame has one row per GPU and window: `window_start` (UTC), `node`, `gpu`, `n` (samples), `last_ts`
(the newest sample), every metric column as its mean, and for cumulative counters and codes also
`<column>_max` (see ml/metrics.py). The service builds the same rows in SQL (metric_windows); this module
builds them from raw samples, so a detector reads one shape whether it runs in a worker or on a laptop.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd

from ml.metrics import METRIC_COLUMNS, WINDOW_MAX_COLUMNS, WINDOW_S

KEYS = ["window_start", "node", "gpu"]


def floor_time(ts: datetime, seconds: float = WINDOW_S) -> datetime:
    """The start of the window that holds `ts` (windows are aligned on the epoch)."""
    epoch = ts.timestamp()
    return datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def from_samples(samples: pd.DataFrame, window_s: float = WINDOW_S) -> pd.DataFrame:
    """Raw samples (ts, node, gpu, metric columns) to window rows, as metric_windows stores them."""
    if not isinstance(samples, pd.DataFrame) or samples.empty or not {"ts", "node", "gpu"} <= set(samples.columns):
        return pd.DataFrame(columns=[*KEYS, "n", "last_ts"])
    frame = samples.copy()
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True, errors="coerce", format="mixed")
    frame["gpu"] = pd.to_numeric(frame["gpu"], errors="coerce")
    frame = frame.dropna(subset=["ts", "node", "gpu"])
    if frame.empty:
        return pd.DataFrame(columns=[*KEYS, "n", "last_ts"])
    frame["gpu"] = frame["gpu"].astype(int)
    frame["node"] = frame["node"].astype(str)
    seconds = (frame["ts"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds()  # whatever the stamps' resolution
    frame["window_start"] = pd.to_datetime(seconds - np.mod(seconds, window_s), unit="s", utc=True)
    columns = [c for c in METRIC_COLUMNS if c in frame.columns]
    for column in columns:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    grouped = frame.groupby(KEYS, sort=True)
    out = grouped[columns].mean() if columns else pd.DataFrame(index=grouped.size().index)
    out["n"] = grouped.size()
    out["last_ts"] = grouped["ts"].max()
    maxed = [c for c in WINDOW_MAX_COLUMNS if c in columns]
    if maxed:
        out = out.join(grouped[maxed].max().add_suffix("_max"))
    return out.reset_index()


def to_samples(windows: pd.DataFrame) -> pd.DataFrame:
    """Window rows as one pseudo-sample per window for detectors written for samples: stamped at the
    window's newest sample, counters and codes at their maximum (so increases between windows add up)."""
    if windows.empty:
        return pd.DataFrame(columns=["ts", "node", "gpu"])
    out = pd.DataFrame({"ts": pd.to_datetime(windows["last_ts"], utc=True), "node": windows["node"]})
    out["gpu"] = windows["gpu"].to_numpy()
    for column in METRIC_COLUMNS:
        source = f"{column}_max" if f"{column}_max" in windows.columns else column
        if source in windows.columns:
            out[column] = pd.to_numeric(windows[source], errors="coerce").to_numpy()
    return out
