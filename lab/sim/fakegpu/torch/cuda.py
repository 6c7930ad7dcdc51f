"""`torch.cuda` on the simulated node: its GPUs as CUDA enumerates them (lab/sim/fakegpu/torch/_node.py)."""

from __future__ import annotations

from torch import _node


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return len(_node.visible())


def get_device_name(ordinal: int = 0) -> str:
    _node.gpu(ordinal)
    return str(_node.state()["model"])


def set_device(ordinal: int) -> None:
    _node.gpu(ordinal)


def synchronize(ordinal: int | None = None) -> None:
    """Nothing to wait for: each fake operation finished when it returned (its time is on the virtual clock)."""
    _node.gpu(ordinal or 0)
