"""The fleet circuit breaker's trip rule (pure): how many nodes automation may have out, and which new take-outs pass.

What counts: a node taken out of service by faultline's own decisions (evict, cordon, diagnose: the scheduler drains
it), made within the window since the last reset, and still out. A reset_gpu keeps its node in service, so it counts
for nothing; but while the breaker is tripped it waits for a person like a take-out, since a rule gone wrong that
resets GPUs across the fleet kills as many jobs' processes as one that evicts.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

# Decisions that take their node out of service: counted against the limit.
TAKE_OUT_KINDS = ("evict", "cordon", "diagnose")
# Decisions that wait for a person while the breaker is tripped.
HELD_KINDS = (*TAKE_OUT_KINDS, "reset_gpu")


def most_out(fleet_nodes: int, *, share: float, min_nodes: int, max_nodes: int | None) -> int:
    """The most nodes automation may have out: `share` of the fleet, rounded down, but at least `min_nodes` (so
    a small fleet still has an automatic eviction or two) and at most `max_nodes` when set (a large fleet's cap)."""
    allowed = max(min_nodes, math.floor(share * max(fleet_nodes, 0) + 1e-9))
    return min(allowed, max_nodes) if max_nodes is not None else allowed


@dataclass(frozen=True, slots=True)
class Verdict:
    """For each candidate in order, whether it may go to the schedulers; whether this batch trips the breaker;
    and how many nodes are out with the admitted ones (before the first held one, when it trips)."""

    admitted: tuple[bool, ...]
    trips: bool
    out: int


def judge(*, out: Collection[str], candidates: Sequence[tuple[str, str]], most: int, tripped: bool) -> Verdict:
    """The breaker's verdict on new automatic decisions `candidates` ((kind, node), in the order they are made),
    given the nodes already out (`out`) and the limit `most`.

    Tripped already: every candidate waits. Otherwise a take-out of a node not yet counted passes while the count
    stays within `most`; the first that would go over trips the breaker, and it and every candidate after it wait
    (automation has stopped). A take-out of a node already out, and a reset_gpu, change no count and pass."""
    counted = set(out)
    admitted: list[bool] = []
    stopped = tripped
    trips = False
    for kind, node in candidates:
        if stopped:
            admitted.append(kind not in HELD_KINDS)
            continue
        if kind in TAKE_OUT_KINDS and node not in counted:
            if len(counted) + 1 > most:
                stopped = trips = True
                admitted.append(False)
                continue
            counted.add(node)
        admitted.append(True)
    return Verdict(tuple(admitted), trips, len(counted))
