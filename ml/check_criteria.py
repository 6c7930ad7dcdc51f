"""Pass criteria for the stop-time checks' figures, from the fleet (SuperBench's way), with a spec fallback.

A figure (GEMM TFLOPS, memory or host-to-device bandwidth, all-reduce bus bandwidth: higher is better) is compared
with the same check on the same GPU model across the fleet's recent passing runs. With at least MIN_HISTORY of
them the cut-off is robust: the median less K_SIGMA robust standard deviations (1.4826 x the median absolute
deviation, which a few bad GPUs in the history cannot drag), clamped so that it is never nearer the median than
MIN_DROP (a very even fleet would otherwise fail a GPU 3% slow on a warm day) nor farther than MAX_DROP (a noisy
fleet would otherwise pass a GPU 20% slow). Until the fleet has that many, the cut-off is SPEC_FLOOR of the
model's spec figure below (the datasheet's; for GEMM the dense bf16 peak), a floor only a clearly broken GPU
falls under: measured throughput sits well below a datasheet peak (an H100 SXM's bf16 GEMM in PyTorch reaches
740 to 800 of its 989 TFLOPS), so the spec alone cannot tell 20% slow from healthy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

MIN_HISTORY = 30
K_SIGMA = 5.0
MIN_DROP = 0.05
MAX_DROP = 0.15
SPEC_FLOOR = 0.5
MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution is 0.6745 sigma

# (GPU model as NVML names it, check) -> datasheet figure in the check's unit. Sources: NVIDIA H100 and H200
# datasheets (dense bf16 tensor TFLOPS, HBM bandwidth GB/s, NVLink 900 GB/s of which all-reduce's bus bandwidth
# counts one direction, 450), and PCIe 5.0 x16 (64 GB/s a direction) for host-to-device.
SPEC: dict[tuple[str, str], float] = {
    ("NVIDIA H100 80GB HBM3", "gemm_bf16"): 989.0,
    ("NVIDIA H100 80GB HBM3", "memory_bandwidth"): 3350.0,
    ("NVIDIA H100 80GB HBM3", "h2d_bandwidth"): 64.0,
    ("NVIDIA H100 80GB HBM3", "allreduce_node"): 450.0,
    ("NVIDIA H200", "gemm_bf16"): 989.0,
    ("NVIDIA H200", "memory_bandwidth"): 4800.0,
    ("NVIDIA H200", "h2d_bandwidth"): 64.0,
    ("NVIDIA H200", "allreduce_node"): 450.0,
}


@dataclass(frozen=True, slots=True)
class Criterion:
    """The cut-off for one check on one GPU model, and what it rests on."""

    cutoff: float | None  # None: nothing to judge by (no history, no spec)
    basis: Literal["fleet", "spec", "none"]
    history: int  # passing runs it was computed from
    median: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Literal["pass", "fail", "not_judged"]
    measured: float
    criterion: Criterion

    @property
    def shortfall(self) -> float | None:
        """How far below the fleet median, as a share (0.2: 20% below); None without a fleet median."""
        median = self.criterion.median
        return None if not median else round(1 - self.measured / median, 4)


def criterion(history: Sequence[float], *, spec: float | None = None) -> Criterion:
    """The cut-off from the recent passing figures of the same check on the same GPU model."""
    values = [v for v in history if v == v and v > 0]  # NaN and non-positive figures are failed runs
    if len(values) >= MIN_HISTORY:
        median = statistics.median(values)
        sigma = MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values)
        cutoff = min(median * (1 - MIN_DROP), max(median * (1 - MAX_DROP), median - K_SIGMA * sigma))
        return Criterion(round(cutoff, 4), "fleet", len(values), median)
    if spec:
        return Criterion(round(spec * SPEC_FLOOR, 4), "spec", len(values))
    return Criterion(None, "none", len(values))


def judge(measured: float, history: Sequence[float], *, spec: float | None = None) -> Verdict:
    """Pass or fail one figure against the fleet (or the spec floor)."""
    rule = criterion(history, spec=spec)
    if rule.cutoff is None:
        return Verdict("not_judged", measured, rule)
    return Verdict("fail" if measured < rule.cutoff else "pass", measured, rule)


def spec_of(model: str | None, check: str) -> float | None:
    return SPEC.get((model or "", check))
