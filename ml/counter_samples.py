"""The counters detector's input (ml/counters.py): a job's GPU samples, prepared once for all its rules.

Samples are sorted by node, GPU and time, with UTC times and integer GPUs; other machines' samples and those
stamped far in the future are dropped, and a sample that follows its GPU's previous one after an absence from
the job is marked, so that a counter's rise across the absence is not counted. Each counter's increases per GPU
are computed once and kept.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from ml.findings import JobInfo

# Samples of a GPU this far apart in the job's data: the machine was away from the job (evicted and in repair, or
# drained) and its counters' rise across the absence happened outside it (a repaired machine swapped back in was
# accused on the errors of the fault it had been evicted for). An agent's restart is a few seconds.
AWAY_S = 120.0
FUTURE_SKEW = timedelta(minutes=5)  # samples stamped further ahead of `now` than this are clock errors

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
