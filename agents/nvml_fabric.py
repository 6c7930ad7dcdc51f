"""A GPU's NVLink fabric through NVML: which NVLink domain (fabric cluster) and clique it belongs to, and how its
registration with the fabric manager went.

On GB200 NVL72 and other multi-node NVLink systems, `nvmlDeviceGetGpuFabricInfoV` answers per GPU: the fabric
cluster's UUID (one per NVLink domain: the 72 GPUs of a rack), the clique id (the GPUs that can talk over
NVLink within it), the state of the GPU's registration (not started, in progress, completed), its status (an
NVML return code: 0 once registered) and, from driver 550 on, a health mask that says whether the fabric runs
with degraded bandwidth and whether the global fabric manager (GFM, on the switch trays) is still connected.
An HGX board with local NVSwitches, a PCIe card or an older driver answers NotSupported or FunctionNotFound:
nothing is reported for it, and it is never asked again.

Read by the NVML reader (agents/nvml.py) when NVML reads the counters; beside dcgm-exporter, which exports no fabric
info, by `ExporterFabric` (NVML opened for the fabric info alone; the agent's --nvml-fabric, on by default).

Reported as (the heartbeat's `gpus[].fabric`, docs/wire.md):
    {"cluster_uuid": "...", "clique_id": 32766, "state": "completed", "status": 0,
     "health": "healthy" | "unhealthy" | "limited_capacity" | None, "degraded_bw": bool | None,
     "gfm": "connected" | "disconnected" | None}
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from agents.gpu import GpuReading, GpuSource

log = logging.getLogger(__name__)

FABRIC_PERIOD_S = 10.0  # as the NVML reader's slow readings (agents/nvml.py SLOW_PERIOD_S)

STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
HEALTH = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}  # 0: the driver does not say
_DEGRADED_BW_SHIFT, _GFM_SHIFT, _FIELD = 0, 14, 0x3  # NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_*
_TRUE, _FALSE = 1, 2  # NVML_GPU_FABRIC_HEALTH_MASK_*_TRUE / _FALSE (and GFM_STATE_CONNECTED / _DISCONNECTED)


class FabricReader:
    """Reads one GPU's fabric info with the newest call and structure the driver answers, falling back in order:
    `nvmlDeviceGetGpuFabricInfoV` with the v3 structure (health summary), with v2 (health mask), then the
    deprecated `nvmlDeviceGetGpuFabricInfo` (no health). `supported` turns False for good once none answers."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.supported = True
        self._error = nv.NVMLError
        self._absent = tuple(
            getattr(nv, name) for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound") if hasattr(nv, name)
        )
        # A structure version the driver does not know is answered ArgumentVersionMismatch: try the older one.
        self._mismatch = tuple(
            getattr(nv, name) for name in ("NVMLError_ArgumentVersionMismatch",) if hasattr(nv, name)
        )
        self._ways = [
            way
            for way in (
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
                ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
            )
            if hasattr(nv, way[0]) and hasattr(nv, way[1])
        ]
        if not self._ways:
            self.supported = False

    def read(self, handle: Any) -> dict[str, Any] | None:
        """The GPU's fabric, or None when it has none (and then `supported` is False) or NVML failed this time."""
        while self._ways:
            call, struct = self._ways[0]
            info = getattr(self.nv, struct)()
            try:
                getattr(self.nv, call)(handle, info)
            except self._absent + self._mismatch as exc:
                log.debug("GPU fabric info: %s with %s answers %s", call, struct, exc)
                self._ways.pop(0)
                continue
            except self._error as exc:
                log.debug("GPU fabric info unreadable now: %s", exc)
                return None
            return fabric_dict(info)
        self.supported = False
        return None


def fabric_dict(info: Any) -> dict[str, Any] | None:
    """The wire form of one fabric info structure; None for a GPU that is in no NVLink fabric."""
    state = STATES.get(int(info.state), str(int(info.state)))
    if state == "not_supported":
        return None
    raw = bytes(info.clusterUuid)
    out: dict[str, Any] = {
        # All zeros before the GPU registered: no cluster yet, which the state says.
        "cluster_uuid": str(uuid.UUID(bytes=raw)) if any(raw) else None,
        "clique_id": int(info.cliqueId),
        "state": state,
        "status": int(info.status),
        "health": None,
        "degraded_bw": None,
        "gfm": None,
    }
    mask = getattr(info, "healthMask", None)
    if mask is not None:
        bw = (int(mask) >> _DEGRADED_BW_SHIFT) & _FIELD
        gfm = (int(mask) >> _GFM_SHIFT) & _FIELD
        out["degraded_bw"] = True if bw == _TRUE else False if bw == _FALSE else None
        out["gfm"] = "connected" if gfm == _TRUE else "disconnected" if gfm == _FALSE else None
    summary = getattr(info, "healthSummary", None)
    if summary is not None:
        out["health"] = HEALTH.get(int(summary))
    return out


class ExporterFabric:
    """The fabric info of every GPU through NVML, for a node whose counters come from dcgm-exporter.

    dcgm-exporter exports no fabric info (the cluster UUID is a string, a Prometheus sample a number), so the agent
    asks NVML for it as the NVML reader does, every `period` seconds (a GPU's registration with the fabric manager
    can change at any time), and keeps NVML open while some GPU answers; once none does (an HGX board, a PCIe card,
    an older driver) it shuts NVML down for good."""

    def __init__(self, nv: Any, count: int, *, period: float = FABRIC_PERIOD_S) -> None:
        self.nv = nv
        self.period = period
        self.clock: Callable[[], float] = time.monotonic
        self._next = 0.0
        self._open = True
        self.gpus: list[tuple[int, Any, str | None, FabricReader]] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError as exc:
                log.debug("GPU %d: no NVML handle for its fabric info (%s)", index, exc)
                continue
            try:
                gpu_uuid: str | None = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError:
                gpu_uuid = None  # matched by its index then
            self.gpus.append((index, handle, gpu_uuid, FabricReader(nv)))
        self.fabric: dict[int, dict[str, Any]] = {}  # GPU index -> its fabric info last read
        self.by_uuid: dict[str, int] = {u: i for i, _, u, _ in self.gpus if u}

    @property
    def supported(self) -> bool:
        return self._open and any(reader.supported for *_, reader in self.gpus)

    def read(self) -> None:
        """Read every GPU's fabric info when due; a GPU that does not answer this time reports none (nothing stale,
        as the NVML reader)."""
        if not self._open or self.clock() < self._next:
            return
        self._next = self.clock() + self.period
        for index, handle, _, reader in self.gpus:
            fabric = reader.read(handle) if reader.supported else None
            if fabric is None:
                self.fabric.pop(index, None)
            else:
                self.fabric[index] = fabric
        if not self.supported:
            log.info("no GPU here is in a multi-node NVLink fabric: its fabric info is not read again")
            self.close()

    def of(self, index: int, gpu_uuid: str | None) -> dict[str, Any] | None:
        """The fabric info of the exporter's GPU `index` (matched by UUID first: both number GPUs as NVML does, but
        an exporter may leave a GPU out)."""
        if gpu_uuid is not None and gpu_uuid in self.by_uuid:
            return self.fabric.get(self.by_uuid[gpu_uuid])
        return self.fabric.get(index)

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self.nv.nvmlShutdown()


class WithFabric:
    """A GPU source (dcgm-exporter) whose readings carry each GPU's fabric info from NVML."""

    def __init__(self, source: GpuSource, fabric: ExporterFabric) -> None:
        self.source = source
        self.fabric = fabric

    def read(self) -> list[GpuReading]:
        readings = self.source.read()
        self.fabric.read()
        for reading in readings:
            reading.fabric = self.fabric.of(reading.gpu, reading.uuid)
        return readings

    def close(self) -> None:
        self.source.close()
        self.fabric.close()


def open_exporter_fabric() -> ExporterFabric | None:
    """NVML for the fabric info beside dcgm-exporter; None on a node without NVML or GPUs (said at debug level: the
    exporter reads the counters, nothing is missing there)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, or NVMLError_LibraryNotFound / DriverNotLoaded in a container without it
        log.debug("GPU fabric info: NVML unavailable (%s)", exc)
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        log.debug("GPU fabric info: NVML counts no GPU (%s)", exc)
        count = 0
    fabric = ExporterFabric(pynvml, count) if count else None
    if fabric is None or not fabric.gpus:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        return None
    return fabric


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
