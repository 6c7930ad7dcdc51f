"""Pass criteria of the stop-time checks from the fleet (ml/check_criteria.py): a GPU 20% below the fleet's GEMM
median fails; a healthy simulated fleet's own spread passes with no false fail; the spec floor until enough
history."""

from __future__ import annotations

import numpy as np
import pytest

from ml.check_criteria import MAX_DROP, MIN_HISTORY, SPEC_FLOOR, criterion, judge, spec_of

H100_GEMM = 797.51  # measured bf16 TFLOPS of one H100 (zzc0721/torch-performance-test-data#79)
MODEL = "NVIDIA H100 80GB HBM3"


def _fleet(rng: np.random.Generator, gpus: int, spread: float, median: float = H100_GEMM) -> np.ndarray:
    """A healthy fleet's figures: each 8-GPU node shifted as a whole (its rack's cooling, its firmware) by half
    the spread, and each GPU around its node by the spread (relative standard deviations, normal)."""
    nodes = rng.normal(0.0, spread / 2, gpus // 8 + 1)
    return median * (1.0 + np.repeat(nodes, 8)[:gpus] + rng.normal(0.0, spread, gpus))


@pytest.mark.parametrize("spread", [0.01, 0.02, 0.03, 0.05, 0.08])
def test_a_gpu_20_percent_below_the_fleet_median_fails(spread: float) -> None:
    rng = np.random.default_rng(28)
    history = _fleet(rng, 2048, spread)
    verdict = judge(0.8 * float(np.median(history)), history.tolist(), spec=spec_of(MODEL, "gemm_bf16"))
    assert verdict.status == "fail" and verdict.criterion.basis == "fleet"
    assert verdict.shortfall == pytest.approx(0.2, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("spread", [0.01, 0.02, 0.03])
def test_a_healthy_fleet_s_spread_passes_with_no_false_fail(seed: int, spread: float) -> None:
    """Yesterday's passing runs set the cut-off; today's run of every GPU of a 512-node fleet is judged by it."""
    rng = np.random.default_rng(seed)
    history = _fleet(rng, 4096, spread).tolist()
    today = _fleet(rng, 4096, spread)
    rule = criterion(history)
    false_fails = int((today < rule.cutoff).sum())
    assert false_fails == 0, (rule, float(today.min()))


def test_a_few_broken_gpus_in_the_history_do_not_move_the_cut_off() -> None:
    rng = np.random.default_rng(7)
    clean = _fleet(rng, 1000, 0.02).tolist()
    polluted = clean[:950] + [0.3 * H100_GEMM] * 50  # 5% of the history from GPUs that were slow and passed anyway
    assert criterion(polluted).cutoff == pytest.approx(criterion(clean).cutoff, rel=0.01)


def test_the_cut_off_stays_between_the_minimum_and_maximum_drop() -> None:
    even = [H100_GEMM] * 40  # no spread at all: a GPU 3% slow still passes
    assert judge(0.97 * H100_GEMM, even).status == "pass"
    assert judge(0.94 * H100_GEMM, even).status == "fail"
    noisy = _fleet(np.random.default_rng(1), 500, 0.10).tolist()  # a noisy fleet still fails 20% slow
    assert criterion(noisy).cutoff == pytest.approx((1 - MAX_DROP) * np.median(noisy), rel=1e-6)


def test_spec_floor_until_the_fleet_has_enough_history_then_the_fleet() -> None:
    spec = spec_of(MODEL, "gemm_bf16")
    assert spec == 989.0
    short = [H100_GEMM] * (MIN_HISTORY - 1)
    rule = criterion(short, spec=spec)
    assert rule.basis == "spec" and rule.cutoff == pytest.approx(SPEC_FLOOR * spec) and rule.history == MIN_HISTORY - 1
    assert judge(0.8 * H100_GEMM, short, spec=spec).status == "pass"  # the spec cannot tell 20% slow from healthy
    assert judge(0.3 * spec, short, spec=spec).status == "fail"  # but it catches a broken GPU
    assert criterion([*short, H100_GEMM], spec=spec).basis == "fleet"


def test_no_history_and_no_spec_is_not_judged_and_failed_figures_are_not_history() -> None:
    verdict = judge(500.0, [float("nan"), 0.0, -1.0], spec=spec_of("Some Future GPU", "gemm_bf16"))
    assert verdict.status == "not_judged" and verdict.criterion.history == 0 and verdict.shortfall is None
