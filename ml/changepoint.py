"""Page's CUSUM: the change-point test for a series that should sit near zero until something changes.

Each value adds its excess over a reference (`drift`) to a running sum that never goes below zero; the sum reaching
`threshold` is the alarm, and the last time it stood at zero before that is the change's estimated onset. Noise
under the reference never accumulates, a small sustained shift accumulates slowly, a large one fast: the wait for a
decision scales with the evidence instead of being a fixed continuity span (Page 1954; Basseville and Nikiforov,
"Detection of Abrupt Changes", section 2.2). Pure: a list of floats in, the alarm out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Alarm:
    """Where the sum crossed the threshold, where the change began (indexes into the series) and the sum then."""

    at: int
    onset: int
    level: float


def cusum(values: Sequence[float], *, drift: float, threshold: float) -> list[float]:
    """The running one-sided sums, one per value; a value that is not a finite number resets the sum (no evidence
    either way: a gap in the data, a span the job did not work through)."""
    if drift < 0 or threshold <= 0:
        raise ValueError("drift must be >= 0 and threshold > 0")
    out: list[float] = []
    level = 0.0
    for v in values:
        level = max(0.0, level + v - drift) if math.isfinite(v) else 0.0
        out.append(level)
    return out


def alarm(values: Sequence[float], *, drift: float, threshold: float) -> Alarm | None:
    """The latest run's alarm: None unless the sum stands at or over `threshold` at the last value (a change that
    went back is no alarm now); else the first crossing of that run and its onset."""
    levels = cusum(values, drift=drift, threshold=threshold)
    if not levels or levels[-1] < threshold:
        return None
    start = len(levels) - 1
    while start > 0 and levels[start - 1] > 0.0:
        start -= 1
    at = next(i for i in range(start, len(levels)) if levels[i] >= threshold)
    return Alarm(at=at, onset=start, level=levels[-1])
