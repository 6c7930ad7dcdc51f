"""Puts this process's wall clock FAULTLINE_SIM_CLOCK_SKEW_S seconds off, as a node whose clock drifted.

The simulator's runner puts this folder first on a simulated node's agent's PYTHONPATH when realism gives
the node a clock skew: Python imports `sitecustomize` at startup, before the agent's own modules, so its
samples, batches and log records carry the node's skewed time. Monotonic clocks stay true, as they do on a
real machine whose wall clock is off.
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time


def _install(skew: float) -> None:
    real_time, real_time_ns = _time.time, _time.time_ns
    skew_ns = int(skew * 1e9)

    def time() -> float:
        return real_time() + skew

    def time_ns() -> int:
        return real_time_ns() + skew_ns

    class datetime(_datetime.datetime):
        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> datetime:
            return cls.fromtimestamp(time(), tz)

        @classmethod
        def utcnow(cls) -> datetime:
            return cls.fromtimestamp(time(), _datetime.UTC).replace(tzinfo=None)

        @classmethod
        def today(cls) -> datetime:
            return cls.fromtimestamp(time())

    _time.time, _time.time_ns = time, time_ns
    _datetime.datetime = datetime  # type: ignore[misc]


_skew = float(os.environ.get("FAULTLINE_SIM_CLOCK_SKEW_S") or 0.0)
if _skew:
    _install(_skew)
