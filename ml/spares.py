"""Warm standby sizing: how many spare nodes a job of N nodes needs to ride out its failures over a horizon.

The model (ByteRobust sizes its standbys the same way, from a binomial):

1. Failures of a node arrive as a Poisson process with one fleet-wide rate, estimated from history as
   rate = failures / node-hours observed (a failure: a node evicted or cordoned for an incident).
2. The probability that a given node fails at least once within the horizon H is p = 1 - exp(-rate * H).
3. Nodes fail independently, so the number of the job's N nodes that fail within H is Binomial(N, p).
4. The job needs S standbys, the smallest S with P(failures <= S) >= q (q = 0.99 by default): with S warm
   spares it replaces every failed node without waiting for a repair in a fraction q of horizons.

Assumptions, and what they cost:
- One rate for every node: a lemon's higher rate is averaged over the fleet (its own incidents are still in
  the count). Per-root-cause rates are reported as a breakdown; they add up to the fleet rate.
- Independence: a shared failure (a switch, a power domain) takes several nodes at once and is undercounted.
- A node counts once per horizon however often it fails: a replaced node does not come back within H.
- The rate is what was observed: with no observed time, or no failure in it, there is no estimate (None),
  never a guessed number; a short history gives a noisy one (the failure count is reported beside it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scipy.stats import binom

# Observed time below which a failure rate means nothing (a day of one node).
MIN_NODE_HOURS = 24.0


def failure_probability(rate_per_hour: float, horizon_h: float) -> float:
    """Probability that a node with this failure rate fails at least once within the horizon."""
    if rate_per_hour < 0 or horizon_h < 0:
        raise ValueError("rate and horizon must not be negative")
    return -math.expm1(-rate_per_hour * horizon_h)


def standbys(nodes: int, p: float, quantile: float) -> int:
    """The smallest S with P(Binomial(nodes, p) <= S) >= quantile."""
    if nodes < 0 or not 0 <= p <= 1 or not 0 < quantile < 1:
        raise ValueError("need nodes >= 0, 0 <= p <= 1 and 0 < quantile < 1")
    if nodes == 0 or p == 0:
        return 0
    s = int(binom.ppf(quantile, nodes, p))
    # ppf works in floating point: settle the boundary on the CDF itself.
    while s > 0 and binom.cdf(s - 1, nodes, p) >= quantile:
        s -= 1
    while binom.cdf(s, nodes, p) < quantile:
        s += 1
    return s


@dataclass(frozen=True)
class Advice:
    nodes: int
    horizon_h: float
    quantile: float
    failures: int
    node_hours: float
    # Failures per node-hour; None without an estimate.
    rate_per_hour: float | None
    p_node: float | None
    standbys: int | None
    # Why there is no estimate, when there is none.
    reason: str | None = None
    by_root_cause: dict[str, float] = field(default_factory=dict)  # failures per node-hour

    @property
    def rate_per_1000_node_hours(self) -> float | None:
        return None if self.rate_per_hour is None else self.rate_per_hour * 1000


def advise(
    *,
    nodes: int,
    horizon_h: float,
    quantile: float,
    failures_by_root_cause: Mapping[str, int],
    node_hours: float,
) -> Advice:
    """Standbys for `nodes` over `horizon_h` hours at `quantile`, from the failures seen in `node_hours`."""
    failures = sum(failures_by_root_cause.values())
    common = {"nodes": nodes, "horizon_h": horizon_h, "quantile": quantile, "failures": failures}
    if node_hours <= 0:
        reason = "no node has been observed yet: there is no failure history to size standbys from"
        return Advice(**common, node_hours=0.0, rate_per_hour=None, p_node=None, standbys=None, reason=reason)
    if node_hours < MIN_NODE_HOURS:
        # A failure in the first minutes of a fleet's history would read as thousands per 1000 node-hours.
        reason = (
            f"only {node_hours:.1f} node-hours observed (at least {MIN_NODE_HOURS:g} needed): too little history "
            "to size standbys"
        )
        return Advice(**common, node_hours=node_hours, rate_per_hour=None, p_node=None, standbys=None, reason=reason)
    if failures == 0:
        reason = f"no failure in {node_hours:.0f} node-hours observed: too little history to size standbys"
        return Advice(**common, node_hours=node_hours, rate_per_hour=None, p_node=None, standbys=None, reason=reason)
    rate = failures / node_hours
    p = failure_probability(rate, horizon_h)
    return Advice(
        **common,
        node_hours=node_hours,
        rate_per_hour=rate,
        p_node=p,
        standbys=standbys(nodes, p, quantile),
        by_root_cause={k: v / node_hours for k, v in sorted(failures_by_root_cause.items()) if v},
    )
