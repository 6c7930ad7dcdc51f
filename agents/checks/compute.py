"""Compute and memory with PyTorch: bf16 GEMM throughput, device memory bandwidth, host-to-device bandwidth and a
numerics check, per GPU.

The figures are judged twice. Here, against the node's other GPUs: one more than NODE_DROP below their median
fails (a GPU that lost clocks or memory bandwidth stands out among identical neighbours, with no history needed).
At the service, against the fleet's recent passing runs on the same GPU model (ml/check_criteria.py), which also
catches a node whose GPUs are all slow.

They run in a child process (`run_isolated`): PyTorch and a CUDA context never enter the agent, whose idle cost
stays what it was, and a GPU that hangs a kernel is killed with the child at the timeout.

The numerics check runs the same GEMM, on the same inputs made on the host, on every GPU, twice: cuBLAS picks
the same kernel for the same shape on the same model, so every result must have the same bits. A GPU whose bits
differ from the majority, or from its own first run, computes wrongly (silent data corruption).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from agents.checks.result import CheckResult, not_available

NODE_DROP = 0.15  # a GPU this far below its node's median fails here; the fleet judges finer
MIN_PEERS = 3  # fewer GPUs have no median worth the name


class Compute(Protocol):
    """What the checks ask of a GPU runtime (PyTorch on CUDA; a fake in the tests)."""

    def devices(self) -> list[tuple[int, str]]: ...  # (index, model name)
    def gemm_tflops(self, gpu: int) -> float: ...
    def memory_gbps(self, gpu: int) -> float: ...
    def h2d_gbps(self, gpu: int) -> float: ...
    def gemm_digest(self, gpu: int) -> str: ...


class TorchCompute:
    """The measurements with PyTorch; `device_type="cpu"` runs the same code without a GPU (tests, small sizes)."""

    def __init__(
        self,
        torch: Any,
        *,
        device_type: str = "cuda",
        gemm_n: int = 8192,
        gemm_iters: int = 50,
        copy_bytes: int = 2 * 2**30,
        copy_iters: int = 20,
        h2d_bytes: int = 512 * 2**20,
        h2d_iters: int = 10,
        digest_n: int = 4096,
    ) -> None:
        self.torch = torch
        self.device_type = device_type
        self.gemm_n, self.gemm_iters = gemm_n, gemm_iters
        self.copy_bytes, self.copy_iters = copy_bytes, copy_iters
        self.h2d_bytes, self.h2d_iters = h2d_bytes, h2d_iters
        self.digest_n = digest_n
        self.dtype = torch.bfloat16

    def _device(self, gpu: int) -> Any:
        return self.torch.device(self.device_type, gpu) if self.device_type == "cuda" else self.torch.device("cpu")

    def _sync(self, gpu: int) -> None:
        if self.device_type == "cuda":
            self.torch.cuda.synchronize(gpu)

    def _timed(self, gpu: int, work: Callable[[], Any], iters: int) -> float:
        work()  # warm-up: kernel selection, allocation
        self._sync(gpu)
        started = time.perf_counter()
        for _ in range(iters):
            work()
        self._sync(gpu)
        return time.perf_counter() - started

    def devices(self) -> list[tuple[int, str]]:
        if self.device_type != "cuda":
            return [(0, "cpu")]
        cuda = self.torch.cuda
        return [(i, cuda.get_device_name(i)) for i in range(cuda.device_count())]

    def gemm_tflops(self, gpu: int) -> float:
        torch, n = self.torch, self.gemm_n
        a = torch.randn(n, n, device=self._device(gpu), dtype=self.dtype)
        b = torch.randn(n, n, device=self._device(gpu), dtype=self.dtype)
        seconds = self._timed(gpu, lambda: torch.mm(a, b), self.gemm_iters)
        return 2 * n**3 * self.gemm_iters / seconds / 1e12

    def memory_gbps(self, gpu: int) -> float:
        torch = self.torch
        src = torch.empty(self.copy_bytes, dtype=torch.uint8, device=self._device(gpu))
        dst = torch.empty_like(src)
        seconds = self._timed(gpu, lambda: dst.copy_(src), self.copy_iters)
        return 2 * self.copy_bytes * self.copy_iters / seconds / 1e9  # each copy reads and writes every byte

    def h2d_gbps(self, gpu: int) -> float:
        torch = self.torch
        pinned = self.device_type == "cuda"  # pageable memory would measure the host's memcpy too
        host = torch.empty(self.h2d_bytes, dtype=torch.uint8, pin_memory=pinned)
        dst = torch.empty(self.h2d_bytes, dtype=torch.uint8, device=self._device(gpu))
        seconds = self._timed(gpu, lambda: dst.copy_(host, non_blocking=pinned), self.h2d_iters)
        return self.h2d_bytes * self.h2d_iters / seconds / 1e9

    def gemm_digest(self, gpu: int) -> str:
        torch, n = self.torch, self.digest_n
        generator = torch.Generator().manual_seed(20261126)  # the same inputs, made on the host, for every GPU
        a = torch.randn(n, n, generator=generator).to(self.dtype).to(self._device(gpu))
        b = torch.randn(n, n, generator=generator).to(self.dtype).to(self._device(gpu))
        out = torch.mm(a, b).float().cpu().contiguous()
        return hashlib.sha256(out.numpy().tobytes()).hexdigest()[:16]


def open_torch() -> tuple[Compute | None, str | None]:
    """(PyTorch on this node's GPUs, None) or (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, f"PyTorch {torch.__version__} sees no CUDA GPU"
    return TorchCompute(torch), None


# (check, method, unit)
_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("gemm_bf16", "gemm_tflops", "TFLOPS"),
    ("memory_bandwidth", "memory_gbps", "GB/s"),
    ("h2d_bandwidth", "h2d_gbps", "GB/s"),
)
CHECKS = (*(check for check, _, _ in _FIGURES), "numerics")


def measure(compute: Compute, check: str) -> list[CheckResult]:
    """One figure per GPU, each judged against the node's median of the same figure."""
    method, unit = next((m, u) for c, m, u in _FIGURES if c == check)
    figures: dict[int, float] = {}
    out: list[CheckResult] = []
    models = dict(compute.devices())
    for gpu in models:
        started = time.monotonic()
        try:
            figures[gpu] = float(getattr(compute, method)(gpu))
        except Exception as exc:  # a CUDA error on one GPU is that GPU's failure, not the suite's
            out.append(CheckResult(check, f"gpu:{gpu}", "fail", unit=unit, evidence={"error": str(exc)[:500]}))
            continue
        figures[gpu] = round(figures[gpu], 2)
        out.append(
            CheckResult(
                check,
                f"gpu:{gpu}",
                "pass",
                measured=figures[gpu],
                unit=unit,
                evidence={"model": models[gpu]},
                duration_s=round(time.monotonic() - started, 3),
            )
        )
    if len(figures) < MIN_PEERS:
        return out
    median = statistics.median(figures.values())
    cutoff = round(median * (1 - NODE_DROP), 2)
    judged = []
    for result in out:
        if result.measured is None:
            judged.append(result)
            continue
        evidence = {**result.evidence, "node_median": median, "node_cutoff": cutoff}
        status = "fail" if result.measured < cutoff else "pass"
        judged.append(
            CheckResult(
                result.check, result.subject, status, result.measured, cutoff, result.unit, evidence, result.duration_s
            )
        )
    return judged


def numerics(compute: Compute) -> list[CheckResult]:
    """The same GEMM's bits on every GPU, twice: a GPU off the majority or off its own first run fails."""
    runs: dict[int, list[str]] = {}
    errors: dict[int, str] = {}
    for gpu, _ in compute.devices():
        try:
            runs[gpu] = [compute.gemm_digest(gpu), compute.gemm_digest(gpu)]
        except Exception as exc:
            errors[gpu] = str(exc)[:500]
    majority = Counter(first for first, _ in runs.values()).most_common(1)
    expected = majority[0][0] if majority else None
    out = [CheckResult("numerics", f"gpu:{gpu}", "fail", evidence={"error": error}) for gpu, error in errors.items()]
    for gpu, (first, second) in runs.items():
        problems = []
        if first != second:
            problems.append("two runs of the same GEMM gave different bits")
        if len(runs) > 1 and first != expected:
            problems.append("its GEMM's bits differ from the other GPUs'")
        evidence: dict[str, Any] = {"digests": [first, second], "majority_digest": expected}
        if problems:
            evidence["problems"] = problems
        out.append(CheckResult("numerics", f"gpu:{gpu}", "fail" if problems else "pass", evidence=evidence))
    return out


def run(compute: Compute | None, check: str, *, why_not: str | None = None) -> list[CheckResult]:
    if compute is None:
        return [not_available(check, why_not or "no GPU runtime")]
    return numerics(compute) if check == "numerics" else measure(compute, check)


def run_isolated(checks: tuple[str, ...] = CHECKS, *, timeout: float) -> list[CheckResult]:
    """The checks in a child process (`python -m agents.checks.compute CHECK...`), killed at the timeout."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agents.checks.compute", *checks],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [
            CheckResult(check, "node", "fail", evidence={"reason": f"timed out after {timeout:g} s"})
            for check in checks
        ]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode != 0 or not lines:
        why = f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
        return [CheckResult(check, "node", "fail", evidence={"reason": why}) for check in checks]
    return [CheckResult(**item) for item in json.loads(lines[-1])]


def main(argv: list[str]) -> int:
    unknown = set(argv) - set(CHECKS)
    if unknown or not argv:
        print(
            f"usage: python -m agents.checks.compute {' '.join(CHECKS)} (unknown: {sorted(unknown)})", file=sys.stderr
        )
        return 2
    runtime, why = open_torch()
    results = [r for check in argv for r in run(runtime, check, why_not=why)]
    print(json.dumps([r.to_wire() for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
