"""A simulated node's PyTorch: just enough of `torch`, `torch.cuda` and `torch.distributed` for the agent's own
check code (agents/checks/compute.py, allreduce_rank.py) to run unchanged on the simulated GPUs (lab/sim/gpustate.py).

Tensors hold no data: a shape, a dtype, a device, and what their bits stand for (a digest of the inputs a GEMM
was made from, or the one value every element holds), so a 2 GiB copy costs nothing. Time is virtual (_node.py):
a GEMM's TFLOPS, a copy's GB/s and an all-reduce's bus bandwidth come out as the simulated GPU's. A GPU whose
kernels hang fails as a CUDA call that timed out; a corrupting GPU's GEMM has other bits each run; a GPU that fell
off the bus is not enumerated.

The runner (lab/sim/runner.py) puts the folder above first on the simulated agent's PYTHONPATH; the agent's check
processes inherit it.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any

from torch import _node, cuda, distributed

__all__ = ["cuda", "distributed"]
__version__ = "2.7.1+simulated"


@dataclass(frozen=True)
class dtype:  # torch's own names, lower case
    name: str
    itemsize: int


bfloat16 = dtype("bfloat16", 2)
float32 = dtype("float32", 4)
uint8 = dtype("uint8", 1)


@dataclass(frozen=True)
class device:
    type: str
    index: int | None = None


class Generator:
    """A host generator: the same seed makes the same inputs."""

    def __init__(self) -> None:
        self.seed, self.drawn = 0, 0

    def manual_seed(self, seed: int) -> Generator:
        self.seed, self.drawn = seed, 0
        return self

    def draw(self) -> bytes:
        self.drawn += 1
        return f"randn:{self.seed}:{self.drawn}".encode()


class _Bits:
    """What `Tensor.numpy()` gives: the bits to hash."""

    def __init__(self, bits: bytes) -> None:
        self.bits = bits

    def tobytes(self) -> bytes:
        return self.bits


class Tensor:
    def __init__(
        self, shape: tuple[int, ...], kind: dtype, where: device, *, bits: bytes = b"", fill: float = 0.0
    ) -> None:
        self.shape, self.dtype, self.device = shape, kind, where
        self.bits, self.fill = bits, fill

    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    def _like(self, kind: dtype | None = None, where: device | None = None, **changes: Any) -> Tensor:
        made = {"bits": self.bits, "fill": self.fill, **changes}
        return Tensor(self.shape, kind or self.dtype, where or self.device, **made)

    def to(self, target: dtype | device) -> Tensor:
        if isinstance(target, dtype):
            return self._like(kind=target)
        if target.type == "cuda":
            _node.gpu(target.index or 0)
        return self._like(where=target)

    def float(self) -> Tensor:
        return self.to(float32)

    def cpu(self) -> Tensor:
        return self.to(device("cpu"))

    def contiguous(self) -> Tensor:
        return self

    def numpy(self) -> _Bits:
        return _Bits(self.bits)

    def copy_(self, src: Tensor, non_blocking: bool = False) -> Tensor:
        """A copy on one GPU reads and writes every byte at its memory bandwidth; one over PCIe goes at its
        host-to-device rate."""
        on_gpu = self.device if self.device.type == "cuda" else src.device
        if on_gpu.type == "cuda":
            nbytes = self.nbytes()
            if self.device.type == src.device.type:
                _node.launch(on_gpu.index or 0, "copy", lambda g: 2 * nbytes / (g["memory_gbps"] * 1e9))
            else:
                _node.launch(on_gpu.index or 0, "host-to-device copy", lambda g: nbytes / (g["h2d_gbps"] * 1e9))
        self.bits, self.fill = src.bits, src.fill
        return self

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        return self._like(kind=uint8, fill=float(self.fill != other))

    def sum(self) -> Tensor:
        return Tensor((), self.dtype, self.device, fill=self.fill * self.numel())

    def item(self) -> float:
        return self.fill


def _shape(size: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def _where(where: device | None) -> device:
    where = where or device("cpu")
    if where.type == "cuda":
        _node.gpu(where.index or 0)
    return where


def randn(
    *size: Any, generator: Generator | None = None, device: device | None = None, dtype: dtype = float32
) -> Tensor:
    bits = generator.draw() if generator is not None else os.urandom(16)
    return Tensor(_shape(size), dtype, _where(device), bits=bits)


def empty(*size: Any, dtype: dtype = float32, device: device | None = None, pin_memory: bool = False) -> Tensor:
    return Tensor(_shape(size), dtype, _where(device))


def empty_like(other: Tensor) -> Tensor:
    return Tensor(other.shape, other.dtype, other.device)


def full(size: Any, fill_value: float, *, dtype: dtype = float32, device: device | None = None) -> Tensor:
    return Tensor(_shape((size,)), dtype, _where(device), fill=float(fill_value))


def mm(a: Tensor, b: Tensor) -> Tensor:
    """A GEMM: 2·n·k·m FLOPs at the GPU's TFLOPS; the same inputs give the same bits unless the GPU corrupts."""
    (n, k), (_, m) = a.shape, b.shape
    bits = hashlib.sha256(b"mm:" + a.bits + b"|" + b.bits).digest()
    if a.device.type == "cuda":
        g = _node.launch(a.device.index or 0, "GEMM", lambda g: 2 * n * k * m / (g["gemm_tflops"] * 1e12))
        if g["corrupting"]:  # silent data corruption: wrong bits, different each run, no error
            bits = os.urandom(32)
    return Tensor((n, m), a.dtype, a.device, bits=bits)
