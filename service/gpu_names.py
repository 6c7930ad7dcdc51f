"""GPUs by index in sentences: a kernel line names a GPU by PCI address ("GPU 0000:df:00"), people and NVIDIA's
tools by index ("GPU 7"). Decisions' reasons are written with both; the web UI shows the index, the address on
hover. Pure functions: the caller looks the inventory up."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")
_ADDRESS = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# "GPU 7 (PCI 0000:df:00)" (already named) or "GPU 0000:df:00" (a kernel line's address).
GPU_IN_TEXT = re.compile(rf"GPU (?:(\d+) \(PCI ({_ADDRESS})\)|({_ADDRESS}))")


def kernel_pci(value: str | None) -> str | None:
    """A PCI bus id as the kernel's Xid lines name a GPU: "00000000:3B:00.0" -> "0000:3b:00"."""
    m = _PCI.match((value or "").strip())
    if not m:
        return None
    return f"{(m.group(1) or '0').rjust(4, '0')[-4:]}:{m.group(2)}:{m.group(3)}".lower()


def bus_id(value: str | None) -> str | None:
    """A GPU's PCI bus id as a reset_gpu decision carries it: the kernel's address with its function, which
    `nvidia-smi -i` accepts ("0000:3b:00" -> "0000:3b:00.0"). An Xid line leaves the function out: a GPU is
    function 0 of its device."""
    m, address = _PCI.match((value or "").strip()), kernel_pci(value)
    return None if m is None or address is None else f"{address}.{m.group(4) or 0}"


def by_address(inventory: Iterable[tuple[str, int, str | None]]) -> dict[tuple[str, str], int]:
    """(node, kernel PCI address) -> GPU index, from (node, index, PCI bus id) rows."""
    out: dict[tuple[str, str], int] = {}
    for node, index, pci in inventory:
        if (key := kernel_pci(pci)) is not None:
            out[(node, key)] = index
    return out


def name_gpus(
    text: str,
    node: str | None,
    indexes: Mapping[tuple[str, str], int],
    render: Callable[[int, str], str] = lambda index, pci: f"GPU {index} (PCI {pci})",
) -> str:
    """`text` with each GPU the inventory knows rendered by `render(index, address)`; without a node, the one
    node of the inventory that has that address and whose name the sentence mentions."""

    def named(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return render(int(m.group(1)), m.group(2))
        key = kernel_pci(m.group(3))
        owners = [node] if node else [n for n, pci in indexes if pci == key and n in text]
        index = indexes.get((owners[0], key or "")) if len(owners) == 1 else None
        return m.group(0) if index is None else render(index, m.group(3))

    return GPU_IN_TEXT.sub(named, text)
