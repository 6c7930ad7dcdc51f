"""A simulated node's NVML: nvidia-ml-py's `pynvml` as lab/fakes/nvml.py fakes it, its GPUs set from the machine's
state (lab/sim/gpustate.py) each time NVML is initialised, so the agent's own driver check (agents/checks/driver.py)
reads the simulated GPUs' fields: a lost GPU answers GpuIsLost, a pending row remap or a narrowed link shows, the
driver asks for a reset while a GSP stays hung.

What NVML answers without measuring (which GPUs, who they are, whether one fell off the bus, their NVLink fabric
info) comes from the machine's live inventory (gpustate.INVENTORY_FILE), read on each such call: the agent reading
the fabric info beside dcgm-exporter (agents/nvml_fabric.py) sees the NVL72 rack's fabric as it is now, and asks the
simulator for no check state. The first other call after an initialisation measures (loads the state, as before).

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

from lab.fakes.nvml import FakeFabric, FakeGpu, FakeNvml  # noqa: E402  (needs the real module in place first)
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


# Calls answered from the inventory alone.
_INVENTORY_CALLS = frozenset(
    {
        "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetIndex", "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo", "nvmlDeviceGetName", "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo",
        "nvmlShutdown",
    }
)  # fmt: skip


def _fabric(entry: dict[str, Any] | None) -> FakeFabric | None:
    return None if entry is None else FakeFabric(**entry)


class SimNvml(FakeNvml):
    """NVML of the simulated node the agent runs for: its GPUs measured afresh after each initialisation (each user
    sees them as they are now, as the real library reads the driver), its inventory read live."""

    def __init__(self, gpus: int) -> None:
        super().__init__(gpus)
        self._measured = False
        self._inventory: tuple[tuple[int, int], dict[str, Any]] | None = None  # (file's mtime and size, content)

    def nvmlInit(self) -> None:
        self._measured = False
        if self._read_inventory() is None:
            self._measure()  # no inventory (an older runner): measured at once, as before
        else:
            self._apply_inventory()
        super().nvmlInit()

    def _count(self, name: str, handle: Any = None) -> FakeGpu | None:
        if self.initialized > 0:
            if name in _INVENTORY_CALLS:
                self._apply_inventory()
            elif not self._measured:
                self._measure()
        return super()._count(name, handle)

    def _measure(self) -> None:
        try:
            state = gpustate.load()
        except RuntimeError:
            raise real.NVMLError_DriverNotLoaded() from None  # as a node whose driver does not answer
        self.set_gpus([fake_gpu(entry, state["model"]) for entry in state["gpus"]])
        self._measured = True
        self._apply_inventory()

    def _read_inventory(self) -> dict[str, Any] | None:
        path = gpustate.inventory_path()
        try:
            st = path.stat() if path is not None else None
        except FileNotFoundError:
            st = None
        if path is None or st is None:
            return None
        key = (st.st_mtime_ns, st.st_size)
        if self._inventory is None or self._inventory[0] != key:
            content = gpustate.read(path)
            if content is None:
                return None
            self._inventory = (key, content)
        return self._inventory[1]

    def _apply_inventory(self) -> None:
        """The GPUs as the inventory has them; once measured, only their fabric (the rest is the state's)."""
        inventory = self._read_inventory()
        if inventory is None:
            return
        entries = inventory["gpus"]
        if self._measured:
            for gpu, entry in zip(self.gpus, entries, strict=False):
                gpu.fabric = _fabric(entry["fabric"])
            return
        self.set_gpus(
            [
                FakeGpu(
                    e["index"], lost=e["lost"], bus=e["bus"], uuid=e["uuid"], name=inventory["model"],
                    fabric=_fabric(e["fabric"]),
                )
                for e in entries
            ]
        )  # fmt: skip


sys.modules["pynvml"] = SimNvml(0)  # type: ignore[assignment]  # what `import pynvml` returns from now on
