"""A simulated node's NVML: nvidia-ml-py's `pynvml` as lab/fakes/nvml.py fakes it, its GPUs set from the machine's
state (lab/sim/gpustate.py) each time NVML is initialised, so the agent's own driver check (agents/checks/driver.py)
reads the simulated GPUs' fields: a lost GPU answers GpuIsLost, a pending row remap or a narrowed link shows, the
driver asks for a reset while a GSP stays hung.

The runner (lab/sim/runner.py) puts this folder first on the simulated agent's PYTHONPATH.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any


def _real_pynvml() -> ModuleType:
    """nvidia-ml-py's own module, from the path past this folder: the fake takes its constants, errors and types."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("pynvml", path)
    if spec is None or spec.loader is None:
        raise ImportError("the simulated NVML needs nvidia-ml-py installed")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pynvml"] = module  # it adds its error classes to sys.modules["pynvml"]; and lab.fakes.nvml imports it
    spec.loader.exec_module(module)
    return module


real = _real_pynvml()

from lab.fakes.nvml import FakeGpu, FakeNvml  # noqa: E402  (needs the real module in place first)
from lab.sim import gpustate  # noqa: E402
from lab.sim.dcgm_fields import INT64_NOT_SUPPORTED  # noqa: E402

# FakeGpu attribute <- the DCGM field the simulator samples (scale: NVML's unit per DCGM's).
_FIELDS: dict[str, tuple[str, float]] = {
    "util": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "mem_util": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "mem_clock": ("DCGM_FI_DEV_MEM_CLOCK", 1.0),
    "temp": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "power_mw": ("DCGM_FI_DEV_POWER_USAGE", 1000.0),
    "power_limit_mw": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1000.0),
    "energy_mj": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1.0),
    "used": ("DCGM_FI_DEV_FB_USED", 2.0**20),
    "free": ("DCGM_FI_DEV_FB_FREE", 2.0**20),
    "pcie_replay": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
    "clock_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
    "link_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN", 1.0),
    "link_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH", 1.0),
    "max_link_gen": ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", 1.0),
    "max_link_width": ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", 1.0),
}
_ECC = {
    (real.NVML_MEMORY_ERROR_TYPE_CORRECTED, real.NVML_VOLATILE_ECC): "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    (real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, real.NVML_VOLATILE_ECC): "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    (real.NVML_MEMORY_ERROR_TYPE_CORRECTED, real.NVML_AGGREGATE_ECC): "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    (real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, real.NVML_AGGREGATE_ECC): "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
}
_REMAPPED = (
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
# The GPU's NVLink error totals, counted on its first link (the driver check sums every link's).
_NVLINK = {
    real.NVML_NVLINK_ERROR_DL_CRC_FLIT: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    real.NVML_NVLINK_ERROR_DL_CRC_DATA: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    real.NVML_NVLINK_ERROR_DL_REPLAY: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    real.NVML_NVLINK_ERROR_DL_RECOVERY: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}
# An H100 has no page retirement (it remaps rows): the simulator samples DCGM's "not supported" for it.
_RETIREMENT = ("nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus")


def fake_gpu(entry: dict[str, Any], model: str) -> FakeGpu:
    """One simulated GPU as NVML answers for it."""
    values: dict[str, float] = entry["values"]
    gpu = FakeGpu(
        entry["index"],
        lost=entry["lost"],
        recovery_action=entry["recovery_action"],
        bus=entry["bus"],
        uuid=entry["uuid"],
        name=model,
    )
    for attribute, (field, scale) in _FIELDS.items():
        if field in values:
            setattr(gpu, attribute, int(values[field] * scale))
    gpu.ecc = {key: int(values.get(field, 0)) for key, field in _ECC.items()}
    gpu.remapped = tuple(int(values.get(field, 0)) for field in _REMAPPED)  # type: ignore[assignment]
    gpu.nvlink_errors = {(0, counter): int(values.get(field, 0)) for counter, field in _NVLINK.items()}
    if values.get("DCGM_FI_DEV_RETIRED_PENDING") == INT64_NOT_SUPPORTED:
        gpu.unsupported.update(_RETIREMENT)
    return gpu


class SimNvml(FakeNvml):
    """NVML of the simulated node the agent runs for: its GPUs read afresh at each first initialisation."""

    def nvmlInit(self) -> None:
        if self.initialized <= 0:
            try:
                state = gpustate.load()
            except RuntimeError:
                raise real.NVMLError_DriverNotLoaded() from None  # as a node whose driver does not answer
            self.set_gpus([fake_gpu(entry, state["model"]) for entry in state["gpus"]])
        super().nvmlInit()


sys.modules["pynvml"] = SimNvml(0)  # type: ignore[assignment]  # what `import pynvml` returns from now on
