"""GPU counters through NVML (nvidia-ml-py) on a node without dcgm-exporter, named as DCGM names its fields.

The service maps DCGM field names to its columns (ml/metrics.py METRIC_COLUMNS) and drops the rest, so every
reading here is shipped under the DCGM name of the same quantity, in DCGM's unit.

Cost, at a 1 s interval on 8 GPUs (measure it: `faultline bench agent --gpu-source nvml-fake`):
- every sample, per GPU: 14 calls (utilization, clocks, temperature, power, energy, memory, PCIe replays,
  clock-event reasons, volatile ECC, and two GPM calls on Hopper or newer);
- every SLOW_PERIOD_S, per GPU and staggered across GPUs: state that changes rarely (aggregate ECC, remapped
  rows, retired pages, PCIe link, power limit), PCIe throughput (the driver measures it over a 20 ms window
  per call, so 16 calls a second would hold the loop 0.3 s), and NVLink: one state and four error counters per
  link, 90 calls on an 18-link H100, more than all the rest together.

A reading the driver answers NotSupported (or FunctionNotFound, an older driver) is dropped for that GPU and
never asked again; any other error (GpuIsLost, Unknown) ships None for that sample and is asked again next
time, so a GPU that fell off the bus shows as missing values and comes back when it answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from agents.gpu import GpuReading
from agents.nvml_fabric import FabricReader

log = logging.getLogger(__name__)

# One service window (ml/metrics.py WINDOW_S): every window gets about one value of each slow reading per GPU.
SLOW_PERIOD_S = 10.0

# nvmlClocksEventReason* bits (DCGM_FI_DEV_CLOCKS_EVENT_REASONS), by the names ml/metrics.py gives them
# (tests/agents/test_nvml.py holds the two tables and pynvml's constants together).
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
# The reasons that mean the GPU is being held back by heat or power hardware, worth a line in the agent's log;
# idle, power cap and sync boost come and go with the workload every second.
SLOWDOWN_FLAGS = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})

LINKS_DOWN = "FAULTLINE_NVLINK_LINKS_DOWN"  # not a DCGM field: ml/metrics.py maps it to nvlink_links_down
# (pynvml constant, DCGM field): summed over the GPU's links, as DCGM's *_COUNT_TOTAL fields are.
NVLINK_COUNTERS = (
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    ("NVML_NVLINK_ERROR_DL_REPLAY", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
)
# (pynvml GPM metric, DCGM field): GPM gives percent, DCGM's profiling fields are ratios 0..1.
GPM_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", "DCGM_FI_PROF_SM_ACTIVE"),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY"),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE"),
)

Values = Sequence[float | None]
Call = Callable[[Any], Values]


def clock_event_flags(mask: float | int | None) -> list[str]:
    """The named reasons set in a clock-events bitmask (empty for none or an unreadable value)."""
    if mask is None or mask != mask or mask < 0:
        return []
    bits = int(mask)
    return [name for name, bit in CLOCK_EVENT_BITS.items() if bits & bit]


class _Probe:
    """One NVML query feeding one or more fields; `calls` holds it and its older drivers' fallbacks, in order."""

    __slots__ = ("calls", "names")

    def __init__(self, names: tuple[str, ...], calls: list[tuple[str, Call]]) -> None:
        self.names = names
        self.calls = calls


def _probes(nv: Any) -> tuple[list[_Probe], list[_Probe]]:
    """(read every sample, read every SLOW_PERIOD_S): fresh lists, since each GPU forgets what it lacks."""

    def f(name: str) -> Any:
        return getattr(nv, name, None)  # an older nvidia-ml-py lacks the newer functions

    def one(name: str, *args: Any, scale: float = 1.0) -> list[tuple[str, Call]]:
        fn = f(name)
        if fn is None:
            return []
        if scale == 1.0:
            return [(name, lambda h: (fn(h, *args),))]
        return [(name, lambda h: (fn(h, *args) * scale,))]

    def utilization(h: Any) -> Values:
        u = nv.nvmlDeviceGetUtilizationRates(h)
        return u.gpu, u.memory

    def memory(h: Any) -> Values:
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return m.used / 2**20, m.free / 2**20  # MiB, as DCGM reports them

    def retired(cause: int) -> Call:
        return lambda h: (len(nv.nvmlDeviceGetRetiredPages(h, cause)),)

    corrected, uncorrected = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    kib = 1024.0  # nvmlDeviceGetPcieThroughput answers KB/s; DCGM_FI_PROF_PCIE_*_BYTES are bytes per second
    fast = [
        _Probe(("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"), [("nvmlDeviceGetUtilizationRates", utilization)]),
        _Probe(("DCGM_FI_DEV_SM_CLOCK",), one("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)),
        _Probe(("DCGM_FI_DEV_MEM_CLOCK",), one("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM)),
        _Probe(("DCGM_FI_DEV_GPU_TEMP",), one("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)),
        _Probe(("DCGM_FI_DEV_POWER_USAGE",), one("nvmlDeviceGetPowerUsage", scale=1e-3)),  # mW -> W
        _Probe(("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"), [("nvmlDeviceGetMemoryInfo", memory)]),
        # Drivers before 535 call the same bitmask throttle reasons.
        _Probe(
            ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",),
            one("nvmlDeviceGetCurrentClocksEventReasons") + one("nvmlDeviceGetCurrentClocksThrottleReasons"),
        ),
        _Probe(("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), one("nvmlDeviceGetTotalEccErrors", corrected, nv.NVML_VOLATILE_ECC)),
        _Probe(
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), one("nvmlDeviceGetTotalEccErrors", uncorrected, nv.NVML_VOLATILE_ECC)
        ),
    ]
    slow = [
        # Counters, read every 10 s as the slow ones: on an H200 (driver 580) the energy counter took 3.0 ms of
        # wall time a call and the replay counter 0.2 ms, against 0.01-0.03 ms for the others; every second
        # on 8 GPUs the energy counter alone would take most of the agent's 2% of a core.
        _Probe(("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), one("nvmlDeviceGetTotalEnergyConsumption")),  # mJ
        _Probe(("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",), one("nvmlDeviceGetPcieReplayCounter")),
        _Probe(
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",), one("nvmlDeviceGetTotalEccErrors", corrected, nv.NVML_AGGREGATE_ECC)
        ),
        _Probe(
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",), one("nvmlDeviceGetTotalEccErrors", uncorrected, nv.NVML_AGGREGATE_ECC)
        ),
        _Probe(
            (
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_ROW_REMAP_PENDING",
                "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            ),
            [("nvmlDeviceGetRemappedRows", nv.nvmlDeviceGetRemappedRows)] if f("nvmlDeviceGetRemappedRows") else [],
        ),
        # Page retirement is Volta/Ampere's; Hopper remaps rows instead and answers NotSupported here.
        _Probe(
            ("DCGM_FI_DEV_RETIRED_SBE",),
            [("nvmlDeviceGetRetiredPages", retired(nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))],
        ),
        _Probe(
            ("DCGM_FI_DEV_RETIRED_DBE",),
            [("nvmlDeviceGetRetiredPages", retired(nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))],
        ),
        _Probe(("DCGM_FI_DEV_RETIRED_PENDING",), one("nvmlDeviceGetRetiredPagesPendingStatus")),
        # A rate, as dcgm-exporter ships these fields (ml/peer_spans.py reads them as one): not integrated into
        # a running total, which would make this node look cumulative beside exporter nodes of the same job.
        _Probe(
            ("DCGM_FI_PROF_PCIE_TX_BYTES",), one("nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_TX_BYTES, scale=kib)
        ),
        _Probe(
            ("DCGM_FI_PROF_PCIE_RX_BYTES",), one("nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_RX_BYTES, scale=kib)
        ),
        # An idle GPU may train its link down to save power: reported as it is, the service judges.
        _Probe(("DCGM_FI_DEV_PCIE_LINK_GEN",), one("nvmlDeviceGetCurrPcieLinkGeneration")),
        _Probe(("DCGM_FI_DEV_PCIE_LINK_WIDTH",), one("nvmlDeviceGetCurrPcieLinkWidth")),
        # The GPU's own maximum where the driver says it; the older call caps it by the slot's.
        _Probe(
            ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",),
            one("nvmlDeviceGetGpuMaxPcieLinkGeneration") + one("nvmlDeviceGetMaxPcieLinkGeneration"),
        ),
        _Probe(("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",), one("nvmlDeviceGetMaxPcieLinkWidth")),
        _Probe(("DCGM_FI_DEV_POWER_MGMT_LIMIT",), one("nvmlDeviceGetPowerManagementLimit", scale=1e-3)),  # mW -> W
    ]
    return fast, slow


class _Gpm:
    """GPU Performance Monitoring (Hopper or newer): DCGM's profiling ratios from two samples a read apart."""

    def __init__(self, nv: Any, handle: Any, metrics: list[tuple[int, str]]) -> None:
        self.nv = nv
        self.metrics = metrics
        self.samples = [nv.nvmlGpmSampleAlloc()]
        try:
            self.samples.append(nv.nvmlGpmSampleAlloc())
            # One request reused every read: only the two samples change.
            self.request = nv.c_nvmlGpmMetricsGet_t()
            self.request.version = nv.NVML_GPM_METRICS_GET_VERSION
            self.request.numMetrics = len(metrics)
            for i, (metric, _) in enumerate(metrics):
                self.request.metrics[i].metricId = metric
            nv.nvmlGpmSampleGet(handle, self.samples[0])
            self.primed = True  # so the first read (`--once`) has an interval to measure
        except Exception:
            self.close()
            raise

    def read(self, handle: Any) -> dict[str, float | None]:
        """The metrics between the previous read and now; raises what NVML raises (the caller sorts it)."""
        previous, current = self.samples
        try:
            self.nv.nvmlGpmSampleGet(handle, current)
        except Exception:
            self.primed = False  # the previous sample is too old to pair with the next one
            raise
        self.samples = [current, previous]
        if not self.primed:
            self.primed = True
            return {name: None for _, name in self.metrics}
        request = self.request
        request.sample1, request.sample2 = previous, current
        self.nv.nvmlGpmMetricsGet(request)
        out: dict[str, float | None] = {}
        for i, (_, name) in enumerate(self.metrics):
            metric = request.metrics[i]
            out[name] = metric.value / 100.0 if metric.nvmlReturn == 0 else None  # percent -> DCGM's ratio
        return out

    def close(self) -> None:
        for sample in self.samples:
            try:
                self.nv.nvmlGpmSampleFree(sample)
            except self.nv.NVMLError as exc:
                log.debug("freeing a GPM sample: %s", exc)
        self.samples = []


class _Gpu:
    """One GPU's handle and what it was found to answer."""

    def __init__(self, index: int, handle: Any, fast: list[_Probe], slow: list[_Probe]) -> None:
        self.index = index
        self.handle = handle
        self.fast = fast
        self.slow = slow
        self.next_slow = 0.0  # the first read takes everything
        self.gpm: _Gpm | None = None
        self.links: list[int] = []  # NVLinks NVML reports on this GPU
        self.expected: set[int] = set()  # links that should be up: active once, or present beside active ones
        self.link_skip: set[tuple[int, int]] = set()  # (link, counter) the driver does not count
        self.failing: set[str] = set()  # readings whose failure was logged, until they answer again
        self.slowdown: frozenset[str] = frozenset()
        self.fabric: dict[str, Any] | None = None  # the NVLink fabric info last read (agents/nvml_fabric.py)
        self.fabric_reader: FabricReader | None = None


class Nvml:
    """Reads DCGM's default counters and more through NVML, named as dcgm-exporter names them."""

    def __init__(self, pynvml: Any, count: int, *, slow_period: float = SLOW_PERIOD_S) -> None:
        nv = self.nv = pynvml
        self.slow_period = slow_period
        self.clock: Callable[[], float] = time.monotonic  # when slow readings are due (a benchmark fakes it)
        self._error = nv.NVMLError
        self._absent = tuple(
            getattr(nv, name) for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound") if hasattr(nv, name)
        )
        # A link index past the GPU's last link is an invalid argument, not an error.
        self._no_link = (
            *self._absent,
            *((nv.NVMLError_InvalidArgument,) if hasattr(nv, "NVMLError_InvalidArgument") else ()),
        )
        self._nvlink_counters = [(getattr(nv, const), name) for const, name in NVLINK_COUNTERS if hasattr(nv, const)]
        self._gpm_metrics = [(getattr(nv, const), name) for const, name in GPM_METRICS if hasattr(nv, const)]
        self.inventory: list[GpuReading] = []
        self.gpus: list[_Gpu] = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except self._error as exc:
                log.warning("GPU %d: NVML gives no handle (%s); its counters are not read", i, exc)
                continue
            self.inventory.append(
                GpuReading(
                    i,
                    uuid=self._identity(nv.nvmlDeviceGetUUID, h),
                    pci_bus_id=self._identity(lambda h: nv.nvmlDeviceGetPciInfo(h).busId, h),
                    model=self._identity(nv.nvmlDeviceGetName, h),
                )
            )
            gpu = _Gpu(i, h, *_probes(nv))
            gpu.fabric_reader = FabricReader(nv)
            gpu.gpm = self._open_gpm(gpu)
            self._find_links(gpu)
            self.gpus.append(gpu)

    def _identity(self, read: Callable[[Any], Any], h: Any) -> str | None:
        try:
            return _text(read(h))
        except self._error as exc:
            log.warning("NVML cannot identify a GPU: %s", exc)
            return None

    def _open_gpm(self, gpu: _Gpu) -> _Gpm | None:
        nv = self.nv
        if not self._gpm_metrics or not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return None
        try:
            if not nv.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                return None
            return _Gpm(nv, gpu.handle, self._gpm_metrics)
        except self._error as exc:  # older than Hopper, MIG mode, or no permission
            log.debug("GPU %d: no GPM profiling metrics (%s)", gpu.index, exc)
            return None

    def _find_links(self, gpu: _Gpu) -> None:
        nv = self.nv
        if not hasattr(nv, "nvmlDeviceGetNvLinkState"):
            return
        active = False
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                state = nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except self._no_link:
                continue
            except self._error as exc:
                log.debug("GPU %d: NVLink %d state unknown at start (%s)", gpu.index, link, exc)
                continue
            gpu.links.append(link)
            active = active or bool(state)
        # A GPU with some links up expects all of them up (an HGX board wires every link): one already down when
        # the agent starts counts too. A GPU with none up has no NVLink in use (a PCIe card without a bridge).
        if active:
            gpu.expected = set(gpu.links)

    # -- reading ---------------------------------------------------------------------------------

    def read(self) -> list[GpuReading]:
        now = self.clock()
        readings = []
        for n, (g, gpu) in enumerate(zip(self.inventory, self.gpus, strict=True)):
            fields: dict[str, float | None] = {}
            self._run(gpu, gpu.fast, fields)
            if gpu.gpm is not None:
                self._read_gpm(gpu, fields)
            if now >= gpu.next_slow:
                self._run(gpu, gpu.slow, fields)
                self._read_nvlink(gpu, fields)
                # Its registration with the fabric manager can change at any time: read again every slow period.
                if gpu.fabric_reader is not None and gpu.fabric_reader.supported:
                    gpu.fabric = gpu.fabric_reader.read(gpu.handle)
                # Staggered: one GPU's slow readings per tick rather than all eight on the same one.
                first = gpu.next_slow == 0.0
                gpu.next_slow = now + self.slow_period * ((1 + n / len(self.gpus)) if first else 1)
            self._note_slowdown(gpu, fields.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
            readings.append(GpuReading(g.gpu, fields, g.uuid, g.pci_bus_id, g.model, fabric=gpu.fabric))
        return readings

    def _run(self, gpu: _Gpu, probes: list[_Probe], out: dict[str, float | None]) -> None:
        gone = []
        for probe in probes:
            values = self._ask(gpu, probe)
            if values is None:
                gone.append(probe)
                continue
            for name, value in zip(probe.names, values, strict=True):
                out[name] = None if value is None else float(value)
        for probe in gone:
            probes.remove(probe)

    def _ask(self, gpu: _Gpu, probe: _Probe) -> Values | None:
        """The probe's values; None values when the GPU fails to answer; None when it never will."""
        while probe.calls:
            label, call = probe.calls[0]
            try:
                values = call(gpu.handle)
            except self._absent as exc:
                log.debug("GPU %d: %s answers %s; not asked again", gpu.index, label, exc)
                probe.calls.pop(0)  # an older driver's fallback, if there is one, is next
                continue
            except self._error as exc:
                self._failed(gpu, label, exc)
                return (None,) * len(probe.names)
            if label in gpu.failing:
                self._recovered(gpu, label)
            return values
        return None

    def _failed(self, gpu: _Gpu, what: str, exc: Exception) -> None:
        if not gpu.failing:
            log.warning("GPU %d: NVML %s failed: %s (its readings are missing until it answers)", gpu.index, what, exc)
        gpu.failing.add(what)

    def _recovered(self, gpu: _Gpu, what: str) -> None:
        gpu.failing.discard(what)
        if not gpu.failing:
            log.info("GPU %d answers NVML again", gpu.index)

    def _read_gpm(self, gpu: _Gpu, out: dict[str, float | None]) -> None:
        assert gpu.gpm is not None
        try:
            out.update(gpu.gpm.read(gpu.handle))
        except self._absent as exc:
            log.debug("GPU %d: GPM answers %s; not asked again", gpu.index, exc)
            gpu.gpm.close()
            gpu.gpm = None
        except self._error as exc:
            self._failed(gpu, "GPM", exc)
            out.update({name: None for _, name in self._gpm_metrics})
        else:
            if "GPM" in gpu.failing:
                self._recovered(gpu, "GPM")

    def _read_nvlink(self, gpu: _Gpu, out: dict[str, float | None]) -> None:
        if not gpu.links:
            return
        nv, h = self.nv, gpu.handle
        down = 0
        sums: dict[str, float] = {}
        try:
            for link in gpu.links:
                try:
                    active = bool(nv.nvmlDeviceGetNvLinkState(h, link))
                except self._no_link:
                    continue
                if active:
                    gpu.expected.add(link)
                elif link in gpu.expected:
                    down += 1
                for counter, name in self._nvlink_counters:
                    if (link, counter) in gpu.link_skip:
                        continue
                    try:
                        sums[name] = sums.get(name, 0.0) + nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
                    except self._no_link:
                        gpu.link_skip.add((link, counter))
                    except self._error:
                        if active:
                            raise
                        # A link that is down may not answer its counters: the others still add up.
        except self._error as exc:
            self._failed(gpu, "NVLink", exc)
            out[LINKS_DOWN] = None
            out.update({name: None for _, name in self._nvlink_counters})
            return
        if "NVLink" in gpu.failing:
            self._recovered(gpu, "NVLink")
        out[LINKS_DOWN] = float(down)
        for name, total in sums.items():
            out[name] = float(total)

    def _note_slowdown(self, gpu: _Gpu, mask: float | None) -> None:
        """One log line when heat or power hardware starts holding the GPU's clocks back, one when it stops."""
        if mask is None:
            return
        flags = frozenset(clock_event_flags(mask)) & SLOWDOWN_FLAGS
        if flags == gpu.slowdown:
            return
        if flags:
            log.warning(
                "GPU %d: clocks held back: %s (clock event reasons 0x%x: %s)",
                gpu.index,
                ", ".join(sorted(flags)),
                int(mask),
                ", ".join(clock_event_flags(mask)),
            )
        else:
            log.info("GPU %d: clocks no longer held back (was %s)", gpu.index, ", ".join(sorted(gpu.slowdown)))
        gpu.slowdown = flags

    def close(self) -> None:
        for gpu in self.gpus:
            if gpu.gpm is not None:
                gpu.gpm.close()
                gpu.gpm = None
        self.nv.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml() -> Nvml | None:
    """NVML when this node has an NVIDIA driver and GPUs; None (said once, by the caller) otherwise."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, or NVMLError_LibraryNotFound / DriverNotLoaded on a GPU-less node
        log.info("no GPU counters: no dcgm-exporter given (--dcgm-url) and NVML is unavailable (%s)", exc)
        return None
    count = pynvml.nvmlDeviceGetCount()
    if count == 0:
        log.info("no GPU counters: NVML sees no GPU on this node")
        pynvml.nvmlShutdown()
        return None
    return Nvml(pynvml, count)
