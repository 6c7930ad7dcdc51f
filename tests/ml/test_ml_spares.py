"""Warm standby sizing: the binomial quantile, hand-checked, and no number without history."""

from __future__ import annotations

import math

import pytest

from ml.spares import advise, failure_probability, standbys


def _cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_hundred_nodes_at_one_percent_need_four_standbys_at_p99() -> None:
    # P(X <= 3) = 0.36603 + 0.36973 + 0.18486 + 0.06100 = 0.98163 < 0.99; P(X <= 4) = 0.99657.
    assert _cdf(3, 100, 0.01) == pytest.approx(0.98163, abs=1e-5)
    assert _cdf(4, 100, 0.01) == pytest.approx(0.99657, abs=1e-5)
    assert standbys(100, 0.01, 0.99) == 4
    # At p90: P(X <= 2) = 0.92063 >= 0.9 and P(X <= 1) = 0.73576 < 0.9.
    assert standbys(100, 0.01, 0.90) == 2


def test_edges() -> None:
    assert standbys(0, 0.5, 0.99) == 0 and standbys(50, 0.0, 0.99) == 0
    assert standbys(10, 1.0, 0.99) == 10
    with pytest.raises(ValueError):
        standbys(10, 0.1, 1.0)


def test_the_rate_becomes_a_probability_over_the_horizon() -> None:
    # 1 failure per 240 node-hours over 24 h: p = 1 - e^-0.1.
    assert failure_probability(1 / 240, 24) == pytest.approx(0.0951626, abs=1e-7)
    assert failure_probability(0, 24) == 0


def test_advice_from_history() -> None:
    a = advise(
        nodes=3, horizon_h=24, quantile=0.99, failures_by_root_cause={"gpu_hardware": 2, "network": 1}, node_hours=720
    )
    assert a.failures == 3 and a.rate_per_1000_node_hours == pytest.approx(1000 * 3 / 720)
    assert a.p_node == pytest.approx(0.0951626, abs=1e-7)
    # P(X <= 1) = 0.97438 < 0.99 <= P(X <= 2) = 0.99914, for Binomial(3, 0.0951626).
    assert _cdf(1, 3, a.p_node) < 0.99 <= _cdf(2, 3, a.p_node)
    assert a.standbys == 2
    assert a.by_root_cause == pytest.approx({"gpu_hardware": 2 / 720, "network": 1 / 720})


def test_no_history_gives_no_number() -> None:
    none = advise(nodes=64, horizon_h=24, quantile=0.99, failures_by_root_cause={}, node_hours=0)
    assert none.standbys is None and none.rate_per_hour is None and "no node has been observed" in (none.reason or "")
    quiet = advise(nodes=64, horizon_h=24, quantile=0.99, failures_by_root_cause={}, node_hours=500)
    assert quiet.standbys is None and "no failure in 500 node-hours" in (quiet.reason or "")


def test_minutes_of_history_give_no_estimate() -> None:
    young = advise(nodes=4, horizon_h=24, quantile=0.99, failures_by_root_cause={"nvlink": 1}, node_hours=0.16)
    assert young.standbys is None and young.rate_per_hour is None
    assert young.reason is not None and "0.2 node-hours observed (at least 24 needed)" in young.reason
