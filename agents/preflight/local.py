"""A node's own preflight checks: a GEMM on each GPU and an all-reduce across them, with the check suite's own code
(agents/checks/compute.py, collectives.py), shorter than the stop-time suite: a job is waiting.

`python -m agents.preflight.local DEVICE` is the GEMM's child process (a hung GPU is killed with it, and PyTorch
never enters a process that outlives it); DEVICE is `cuda`, or `cpu` to run the same code without a GPU (gloo).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from typing import Any

from agents.checks import collectives, compute
from agents.checks.result import CheckResult, not_available
from agents.preflight.search import LocalReport

# Sizes per device: an 8192 bf16 GEMM is ~1 ms on an H100; the CPU's is small so a CI run stays short.
GEMM_SIZE = {"cuda": (8192, 20), "cpu": (256, 3)}
# On the CPU, the best of this many short runs, one thread each, spread over CPU_GEMM_SPREAD_S: nodes sharing a
# host's cores (a test's processes, a CPU job's pods) start together after their rendezvous, and measured at once,
# each gets the scheduler's share (less with every process's thread pool spinning on the same cores), so a healthy
# one would be named. A truly slow CPU is slow in every run.
CPU_GEMM_RUNS = 7
CPU_GEMM_SPREAD_S = 1.5
LOCAL_ALLREDUCE_BYTES = 64 * 2**20


def gemm_isolated(device: str, *, timeout: float) -> list[CheckResult]:
    """The GEMM on every GPU in a child process, killed at the timeout; on the CPU (gloo), in this process, which
    has imported PyTorch for its control plane already (there is no GPU to hang)."""
    if device == "cpu":
        return gemm(device)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agents.preflight.local", device],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [CheckResult("gemm_bf16", "node", "fail", evidence={"reason": f"timed out after {timeout:g} s"})]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode != 0 or not lines:
        why = f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
        return [CheckResult("gemm_bf16", "node", "fail", evidence={"reason": why})]
    return [CheckResult(**item) for item in json.loads(lines[-1])]


def run_local(*, backend: str, gpus: int, timeout: float) -> list[CheckResult]:
    """The node's results, as the service stores them. `gpus` is the ranks of the local all-reduce: the node's
    GPUs with NCCL; with gloo, CPU processes (fewer than two: not run)."""
    device = "cuda" if backend == "nccl" else "cpu"
    started = time.monotonic()
    results = gemm_isolated(device, timeout=timeout)
    left = max(10.0, timeout - (time.monotonic() - started))
    if gpus >= 2:
        results.append(
            collectives.allreduce(
                "allreduce_node", nproc=gpus, backend=backend, nbytes=LOCAL_ALLREDUCE_BYTES, iters=5, timeout=left
            )
        )
    else:
        results.append(not_available("allreduce_node", "fewer than two local ranks"))
    return results


def report_of(node: str, results: list[CheckResult]) -> LocalReport:
    """What the search compares across the allocation: the slowest GPU's GEMM, the local all-reduce's busbw."""
    failures = tuple(
        f"{r.check} {r.subject}: {_why(r)}" for r in results if r.status == "fail"
    )  # the suite's own verdicts: an error, a GPU below its node's median
    figures: dict[str, float] = {}
    gemms = [r.measured for r in results if r.check == "gemm_bf16" and r.measured is not None]
    if gemms:
        figures["gemm_tflops"] = min(gemms)
    for r in results:
        if r.check == "allreduce_node" and r.measured is not None:
            figures["allreduce_node_gbps"] = r.measured
    return LocalReport(node, failures, figures)


def _why(result: CheckResult) -> str:
    ev = result.evidence
    if result.measured is not None and result.expected is not None:
        return f"{result.measured:g} below {result.expected:g} {result.unit or ''}".rstrip()
    for key in ("problems", "errors", "error", "reason"):
        if ev.get(key):
            value = ev[key]
            return str(value[0] if isinstance(value, list) else value)[:300]
    return "failed"


def main(argv: list[str]) -> int:
    if argv not in (["cuda"], ["cpu"]):
        print("usage: python -m agents.preflight.local cuda|cpu", file=sys.stderr)
        return 2
    print(json.dumps([r.to_wire() for r in gemm(argv[0])]))
    return 0


def gemm(device: str) -> list[CheckResult]:
    """compute.py's GEMM check with the preflight's sizes."""
    runtime: Any
    if device == "cuda":
        runtime, why = compute.open_torch()
        if runtime is None:
            return [not_available("gemm_bf16", why or "no CUDA")]
        n, iters = GEMM_SIZE["cuda"]
        runtime.gemm_n, runtime.gemm_iters = n, iters
    else:
        import torch

        n, iters = GEMM_SIZE["cpu"]
        runtime = compute.TorchCompute(torch, device_type="cpu", gemm_n=n, gemm_iters=iters)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            runs = []
            for _ in range(CPU_GEMM_RUNS):
                runs.append(compute.measure(runtime, "gemm_bf16"))
                time.sleep(random.uniform(0.5, 1.5) * CPU_GEMM_SPREAD_S / CPU_GEMM_RUNS)
        finally:
            torch.set_num_threads(threads)
        return max(runs, key=lambda results: min(r.measured or 0.0 for r in results))
    return compute.measure(runtime, "gemm_bf16")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
