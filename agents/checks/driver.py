"""Driver state from NVML, through the agent's own reader (agents/nvml.py): what a GPU's counters say about it at
rest, before any load is put on it.

One result per GPU, failing on what NVIDIA's guidance treats as a GPU to reset or replace (the GPU memory error
management and Xid documents): a row remap pending (reset the GPU) or failed (replace it), a page retirement
pending or for double-bit errors, a volatile double-bit ECC error, a PCIe link narrower than its maximum, clocks
held back by thermal or power-brake hardware, an NVLink that was up and is down, and a GPU that answers nothing.
A PCIe generation below the maximum is evidence only: an idle GPU trains its link down to save power.
"""

from __future__ import annotations

import time
from typing import Any

from agents.checks.result import CheckResult, not_available
from agents.nvml import LINKS_DOWN, SLOWDOWN_FLAGS, Nvml, clock_event_flags, open_nvml

CHECK = "nvml_state"

# DCGM field -> (what it means when above zero, the action NVIDIA's guidance gives).
_MUST_BE_ZERO: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("row remap pending", "reset_gpu"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row remap failed", "replace"),
    "DCGM_FI_DEV_RETIRED_PENDING": ("page retirement pending", "reset_gpu"),
    "DCGM_FI_DEV_RETIRED_DBE": ("pages retired for double-bit errors", "replace"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("double-bit ECC errors since the driver loaded", "reset_gpu"),
    LINKS_DOWN: ("NVLinks down", "replace"),
}
# Counted as evidence, not judged alone: the service sees their history.
_EVIDENCE = (
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
    "DCGM_FI_DEV_GPU_TEMP",
)


def judge(fields: dict[str, float | None]) -> tuple[list[str], str | None]:
    """(problems found, the strongest action they call for: replace > reset_gpu) in one GPU's NVML fields."""
    if fields and all(value is None for value in fields.values()):
        return ["the GPU answers no NVML query (fallen off the bus?)"], "replace"
    problems: list[str] = []
    actions: set[str] = set()
    for name, (what, action) in _MUST_BE_ZERO.items():
        value = fields.get(name)
        if value is not None and value > 0:
            problems.append(f"{what}: {value:g}")
            actions.add(action)
    width, max_width = fields.get("DCGM_FI_DEV_PCIE_LINK_WIDTH"), fields.get("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH")
    if width is not None and max_width is not None and width < max_width:
        problems.append(f"PCIe link x{width:g} of x{max_width:g}")
        actions.add("replace")
    held = sorted(set(clock_event_flags(fields.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))) & SLOWDOWN_FLAGS)
    if held:
        problems.append("clocks held back: " + ", ".join(held))
        actions.add("replace")
    action = "replace" if "replace" in actions else ("reset_gpu" if actions else None)
    return problems, action


def results_from(reader: Nvml) -> list[CheckResult]:
    """One result per GPU from one full read (every slow reading included)."""
    reader.slow_period = 0.0
    started = time.monotonic()
    readings = reader.read()
    took = round(time.monotonic() - started, 3)
    out = []
    for reading in readings:
        problems, action = judge(reading.fields)
        evidence: dict[str, Any] = {"model": reading.model, "uuid": reading.uuid, "pci_bus_id": reading.pci_bus_id}
        evidence["fields"] = {k: reading.fields[k] for k in _EVIDENCE if reading.fields.get(k) is not None}
        evidence["clock_event_reasons"] = clock_event_flags(reading.fields.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
        if problems:
            evidence["problems"] = problems
            evidence["action"] = action
        out.append(
            CheckResult(
                CHECK,
                f"gpu:{reading.gpu}",
                "fail" if problems else "pass",
                measured=float(len(problems)),
                expected=0.0,
                unit="problems",
                evidence=evidence,
                duration_s=took,
            )
        )
    return out


def run() -> list[CheckResult]:
    reader = open_nvml()
    if reader is None:
        return [not_available(CHECK, "NVML is unavailable (no NVIDIA driver, or no GPU)")]
    try:
        return results_from(reader)
    finally:
        reader.close()
