"""A stand-in for nvidia-ml-py's `pynvml` on a GPU-less machine: H100-like GPUs whose state a test sets.

It behaves like the real module where the agent can tell: the constants, the exception classes (NVMLError and
its per-code subclasses, NVMLError_NotSupported, NVMLError_GpuIsLost, ...) and the ctypes structures are the
real module's own, device handles are ctypes pointers (a new pointer object to the same device on every
call, as pynvml returns them), functions take the real signatures and answer what the real ones answer
(structures with attributes, tuples, lists). Every call is counted, per function and per GPU.

`install(gpus=8)` puts one in sys.modules["pynvml"] (the agent benchmark starts the agent that way).
"""

from __future__ import annotations

import ctypes
import queue
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

_LINKS = 18  # an H100 SXM's NVLinks


def _gpm_defaults() -> dict[int, float]:
    return {
        real.NVML_GPM_METRIC_SM_UTIL: 88.0,
        real.NVML_GPM_METRIC_SM_OCCUPANCY: 52.0,
        real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 61.0,
        real.NVML_GPM_METRIC_DRAM_BW_UTIL: 47.0,
    }


@dataclass
class FakeFabric:
    """A GPU's NVLink fabric info (nvmlDeviceGetGpuFabricInfoV), as a GB200 NVL72 compute tray's GPU answers it."""

    cluster_uuid: str = "6a7c1f3e-2b5d-4e8f-9a01-3c4d5e6f7a8b"  # the NVLink domain (one per rack)
    clique_id: int = 32766
    state: int = real.NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = real.NVML_SUCCESS
    degraded_bw: bool = False
    gfm_connected: bool = True  # the global fabric manager on the switch trays still talks to the GPU
    summary: int = real.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    version: int = 3  # the newest structure the driver knows (2: a 550-era driver, no health summary)

    @property
    def health_mask(self) -> int:
        bw = (real.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE, real.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE)[
            self.degraded_bw
        ]
        gfm = (
            real.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_DISCONNECTED,
            real.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_CONNECTED,
        )[self.gfm_connected]
        return (bw << real.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) | (
            gfm << real.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE
        )


@dataclass
class FakeGpu:
    """What one GPU answers; tests change these between reads."""

    index: int
    util: int = 97
    mem_util: int = 44
    sm_clock: int = 1980
    mem_clock: int = 2619
    temp: int = 61
    power_mw: int = 640_500
    power_limit_mw: int = 700_000
    energy_mj: int = 4_100_000_000
    used: int = 70_000 * 2**20
    free: int = 11_000 * 2**20
    pcie_replay: int = 0
    clock_reasons: int = 0
    # (memory error type, counter type) -> count
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    retired: dict[int, list[int]] = field(default_factory=dict)  # cause -> page addresses
    retired_pending: int = 0
    pcie_tx_kbs: int = 1_100_000
    pcie_rx_kbs: int = 1_300_000
    link_gen: int = 5
    link_width: int = 16
    max_link_gen: int = 5
    max_link_width: int = 16
    nvlinks: list[int] = field(default_factory=lambda: [1] * _LINKS)  # state per link: 1 active
    # (link, counter) -> count
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    gpm: dict[int, float] | None = field(default_factory=_gpm_defaults)  # None: not Hopper, no GPM
    xid_events: bool = True
    # Functions that answer NotSupported on this GPU.
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False  # every call answers GpuIsLost (fell off the bus)
    recovery_action: int = 0  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: what the driver asks for (0: nothing)
    bus: int | None = None  # its PCI bus number; None: 0x18 + index
    uuid: str | None = None  # None: one made from the index
    name: str = "NVIDIA H100 80GB HBM3"
    fabric: FakeFabric | None = None  # None: no multi-node NVLink fabric (an HGX board): NotSupported

    @property
    def bus_id(self) -> bytes:
        bus = 0x18 + self.index if self.bus is None else self.bus
        return f"00000000:{bus:02X}:00.0".encode()


class _EventSet:
    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.events: queue.Queue[Any] = queue.Queue()
        self.freed = False


class FakeNvml:
    """The pynvml module of a node with `gpus` H100s (set `gpus[i]` fields to change what one answers)."""

    def __init__(self, gpus: int = 8, *, missing: tuple[str, ...] = ()) -> None:
        # The real module's constants, error classes and structures, so the agent sees the real values and types.
        for name in dir(real):
            value = getattr(real, name)
            constant = name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")) and isinstance(value, int)
            if constant or name.startswith(("NVMLError", "c_nvml", "struct_c_nvml", "nvmlPciInfo")):
                setattr(self, name, value)
        self._structs: list[Any] = []
        self._by_address: dict[int, int] = {}
        self.set_gpus([FakeGpu(i) for i in range(gpus)])
        self.missing = set(missing)  # functions this driver lacks: FunctionNotFound, as an old libnvidia-ml answers
        self.calls: Counter[str] = Counter()
        self.gpu_calls: Counter[tuple[str, int]] = Counter()
        self.initialized = 0
        self.samples: dict[int, tuple[int, dict[int, float]] | None] = {}  # live GPM samples by address
        self._keep: list[Any] = []  # the GPM sample structures, alive while allocated
        self.event_sets: list[_EventSet] = []
        self.wait_errors: list[Exception] = []  # raised by the next waits, in order (a driver in trouble)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the fake pynvml has no {name} (the real one: {hasattr(real, name)})")

    # -- plumbing ----------------------------------------------------------------------------------

    def _count(self, name: str, handle: Any = None) -> FakeGpu | None:
        with self._lock:
            self.calls[name] += 1
        if name in self.missing:
            raise real.NVMLError_FunctionNotFound()
        if self.initialized <= 0:
            raise real.NVMLError_Uninitialized()
        if handle is None:
            return None
        gpu = self.gpus[self._index(handle)]
        with self._lock:
            self.gpu_calls[(name, gpu.index)] += 1
        if gpu.lost:
            raise real.NVMLError_GpuIsLost()
        if name in gpu.unsupported:
            raise real.NVMLError_NotSupported()
        return gpu

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        gpu = self._count(name, handle)
        assert gpu is not None
        return gpu

    def _index(self, handle: Any) -> int:
        if not isinstance(handle, real.c_nvmlDevice_t):
            raise TypeError(f"not a device handle: {handle!r}")  # ctypes would refuse it too
        try:
            return self._by_address[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError):
            raise real.NVMLError_InvalidArgument() from None

    def set_gpus(self, gpus: list[FakeGpu]) -> None:
        """The node's GPUs from now on (their handles change when their number does)."""
        self.gpus = gpus
        if len(gpus) != len(self._structs):
            self._structs = [real.struct_c_nvmlDevice_t() for _ in gpus]
            self._by_address = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}

    def handle(self, index: int) -> Any:
        return ctypes.pointer(self._structs[index])

    def total_calls(self) -> int:
        return sum(self.calls.values())

    # -- library -----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._count("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise real.NVMLError_InvalidArgument()
        return self.handle(index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle).index

    # -- identity ----------------------------------------------------------------------------------

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        info = real.nvmlPciInfo_t()
        info.busId = gpu.bus_id
        info.busIdLegacy = gpu.bus_id[4:]
        info.bus = int(gpu.bus_id[9:11], 16)
        return info

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return gpu.uuid or f"GPU-0d6f4c1e-9a51-4c2b-8f7e-{gpu.index:012x}"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    # -- counters ----------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return real.c_nvmlUtilization_t(gpu=gpu.util, memory=gpu.mem_util)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        return {real.NVML_CLOCK_SM: gpu.sm_clock, real.NVML_CLOCK_GRAPHICS: gpu.sm_clock}.get(clock, gpu.mem_clock)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return real.c_nvmlMemory_t(total=gpu.used + gpu.free, free=gpu.free, used=gpu.used)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEccErrors", handle).ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", handle).remapped

    def nvmlDeviceGetRetiredPages(self, handle: Any, source_filter: int) -> list[int]:
        return list(self._gpu("nvmlDeviceGetRetiredPages", handle).retired.get(source_filter, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle).retired_pending

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
        return gpu.pcie_tx_kbs if counter == real.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kbs

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).link_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).link_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).max_link_gen

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle).max_link_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).max_link_width

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        """The fields this fake knows (the recovery action); the others answer NotSupported, each in its own slot."""
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            if field_id == real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.recovery_action
                value.nvmlReturn = real.NVML_SUCCESS
            else:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values

    # -- NVLink ------------------------------------------------------------------------------------

    def _link(self, name: str, handle: Any, link: int) -> FakeGpu:
        gpu = self._gpu(name, handle)
        if not 0 <= link < len(gpu.nvlinks):
            raise real.NVMLError_InvalidArgument()  # past the GPU's last link
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkState", handle, link).nvlinks[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        return self._link("nvmlDeviceGetNvLinkErrorCounter", handle, link).nvlink_errors.get((link, counter), 0)

    # -- the NVLink fabric (multi-node NVLink: GB200 NVL72) -------------------------------------------

    def _fill_fabric(self, gpu: FakeGpu, info: Any) -> None:
        fabric = gpu.fabric
        if fabric is None:
            raise real.NVMLError_NotSupported()
        info.clusterUuid[:] = list(uuid.UUID(fabric.cluster_uuid).bytes)
        info.cliqueId = fabric.clique_id
        info.state = fabric.state
        info.status = fabric.status

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfoV", handle)
        known = {real.nvmlGpuFabricInfo_v2: 2, real.nvmlGpuFabricInfo_v3: 3}.get(info.version)
        if known is None or (gpu.fabric is not None and known > gpu.fabric.version):
            raise real.NVMLError_ArgumentVersionMismatch()
        self._fill_fabric(gpu, info)
        assert gpu.fabric is not None
        info.healthMask = gpu.fabric.health_mask
        if known >= 3:
            info.healthSummary = gpu.fabric.summary
        return real.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        self._fill_fabric(self._gpu("nvmlDeviceGetGpuFabricInfo", handle), info)
        return real.NVML_SUCCESS

    # -- GPM ---------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", handle)
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._count("nvmlGpmSampleAlloc")
        struct = real.struct_c_nvmlGpmSample_t()
        self._keep.append(struct)
        sample = ctypes.pointer(struct)
        self.samples[ctypes.addressof(struct)] = None
        return ctypes.cast(sample, real.c_nvmlGpmSample_t)

    def _sample_address(self, sample: Any) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value
        if address not in self.samples:
            raise real.NVMLError_InvalidArgument()  # never allocated, or freed
        return address  # type: ignore[return-value]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._gpu("nvmlGpmSampleGet", handle)
        if gpu.gpm is None:
            raise real.NVMLError_NotSupported()
        self.samples[self._sample_address(sample)] = (gpu.index, dict(gpu.gpm))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._count("nvmlGpmMetricsGet")
        if request.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise real.NVMLError_ArgumentVersionMismatch()
        first = self.samples[self._sample_address(request.sample1)]
        second = self.samples[self._sample_address(request.sample2)]
        if first is None or second is None or first[0] != second[0]:
            raise real.NVMLError_InvalidArgument()  # a sample never taken, or two GPUs' samples
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in second[1]:
                metric.value = second[1][metric.metricId]
                metric.nvmlReturn = real.NVML_SUCCESS
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._count("nvmlGpmSampleFree")
        del self.samples[self._sample_address(sample)]

    # -- events ------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._count("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: _EventSet) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_events:
            raise real.NVMLError_NotSupported()
        if event_types & real.nvmlEventTypeXidCriticalError:
            event_set.devices.add(gpu.index)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeoutms: int) -> Any:
        self._count("nvmlEventSetWait_v2")
        if event_set.freed:
            raise real.NVMLError_InvalidArgument()
        if self.wait_errors:
            raise self.wait_errors.pop(0)
        try:
            return event_set.events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise real.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._count("nvmlEventSetFree")
        event_set.freed = True

    def xid(self, index: int, code: int) -> None:
        """The driver raising Xid `code` on GPU `index`: an event on every set it is registered with."""
        for event_set in self.event_sets:
            if index in event_set.devices and not event_set.freed:
                data = real.c_nvmlEventData_t()
                data.device = self.handle(index)
                data.eventType = real.nvmlEventTypeXidCriticalError
                data.eventData = code
                data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
                event_set.events.put(data)


def install(gpus: int = 8) -> FakeNvml:
    """A fake node's NVML in place of pynvml, for this process."""
    fake = FakeNvml(gpus)
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    return fake
