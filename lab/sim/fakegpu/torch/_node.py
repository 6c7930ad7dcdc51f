"""The simulated node's GPUs as the fake PyTorch sees them, and the clock their work moves.

The measurements (agents/checks/compute.py, allreduce_rank.py) time GPU work with `time.perf_counter`. In this
process it is a virtual clock that only the fake GPU's operations advance, each by its work over the simulated
GPU's rate (FLOPs over its TFLOPS, bytes over its GB/s), so a figure comes out as the simulator's, not as the
speed of the machine the simulator runs on. `time.monotonic` and `time.sleep` stay real: timeouts are real.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lab.sim import gpustate

_now = time.perf_counter()


def _virtual_perf_counter() -> float:
    return _now


time.perf_counter = _virtual_perf_counter


def advance(seconds: float) -> None:
    global _now
    _now += seconds


_state: dict[str, Any] | None = None


def state() -> dict[str, Any]:
    """The node's GPU state, once its simulated check time is over (the first call waits: the measurements)."""
    global _state
    if _state is None:
        _state = gpustate.load(done=True)
    return _state


def visible() -> list[dict[str, Any]]:
    """The GPUs CUDA enumerates, by ordinal: a GPU that fell off the bus is not among them."""
    return [g for g in state()["gpus"] if not g["lost"]]


def gpu(ordinal: int) -> dict[str, Any]:
    gpus = visible()
    if not 0 <= ordinal < len(gpus):
        raise RuntimeError("CUDA error: invalid device ordinal")
    return gpus[ordinal]


def launch(ordinal: int, what: str, seconds: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
    """Run `what` on the GPU for `seconds(its figures)` of its time; a GPU whose kernels hang fails it as a call
    that timed out."""
    g = gpu(ordinal)
    if g["hung"]:
        raise RuntimeError(f"CUDA error: the {what} on GPU {ordinal} did not finish (timed out)")
    advance(seconds(g))
    return g
