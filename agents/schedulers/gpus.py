"""The GPU a reset_gpu decision names, as the adapters pass it on: its index when faultline's inventory of the
node knows it (`gpu`), else its PCI bus id (`gpu_pci`, "0000:3b:00.0": a node whose agent reports no GPU
inventory, with no NVML or only the kernel log). `nvidia-smi -r -i` takes either."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# domain:bus:device.function; the domain with 4 to 8 digits (the kernel's form or NVML's).
_BUS_ID = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def bus_id(value: object) -> str | None:
    """A PCI bus id in the form decisions carry ("0000:3b:00.0", lower case, the domain at least 4 digits);
    None for anything else, so nothing but a bus id reaches a command line."""
    m = _BUS_ID.match(value.strip()) if isinstance(value, str) else None
    if m is None:
        return None
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def decision_gpu(decision: Mapping[str, Any]) -> int | str | None:
    """The decision's GPU: its index, else its PCI bus id; None when it names neither validly."""
    gpu = decision.get("gpu")
    if gpu is not None:
        return gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0 else None
    return bus_id(decision.get("gpu_pci"))


def nvidia_smi_id(gpu: int | str) -> str:
    """What `nvidia-smi -i` takes for the GPU: the index, or the bus id in NVML's own form ("00000000:3B:00.0",
    as `nvidia-smi --query-gpu=pci.bus_id` prints it)."""
    if isinstance(gpu, int):
        return str(gpu)
    domain, rest = gpu.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def reset_command(gpu: int | str) -> str:
    """The reset to run on the node once the GPU is idle."""
    return f"nvidia-smi -r -i {nvidia_smi_id(gpu)}"


def label_token(gpu: int | str) -> str:
    """The GPU in a Kubernetes label value, which allows neither ':' nor (being our list separator) '.': an index
    as is, a bus id with both as '-' ("0000:3b:00.0" -> "0000-3b-00-0")."""
    return str(gpu) if isinstance(gpu, int) else gpu.replace(":", "-").replace(".", "-")
