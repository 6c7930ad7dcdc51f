"""Xid errors from NVML's event API: a second Xid source for an agent that cannot read the kernel log.

A container without /dev/kmsg (or run with --kmsg none) still sees Xids this way. Each NVML event becomes the
event the kernel parser makes of the driver's own line, `NVRM: Xid (PCI:0000:3b:00): 79, (from NVML event)`: the
same kind, fields and urgency (agents/parsers/xid.py), so the service reads it as a kernel one; only its
source says "nvml". NVML gives the code and the GPU, not the driver's message, so what the kernel parser
reads from the message (process, NVLink subcodes, Xid 154's recovery action) is absent.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
from datetime import UTC, datetime
from typing import Any

from agents.events import Event
from agents.nvml import Nvml
from agents.parsers.kernel import KernelLogParser

log = logging.getLogger(__name__)

SOURCE = "nvml"
WAIT_MS = 500  # how long one wait blocks: the thread notices a stop within this
_ERROR_PAUSE_S = 5.0  # after a failed wait (GPU lost, driver trouble), before waiting again
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event outside MIG


def pci_device(bus_id: str | None) -> str | None:
    """NVML's "00000000:3B:00.0" as the kernel's Xid lines name the device: "0000:3b:00"."""
    if not bus_id:
        return None
    parts = bus_id.lower().split(":")
    if len(parts) != 3:
        return None
    domain, bus, function = parts
    return f"{domain[-4:]}:{bus}:{function.split('.', 1)[0]}"


def xid_line(code: int, pci: str | None, gpu_instance: int | None = None, compute_instance: int | None = None) -> str:
    """The driver's kernel line for an Xid, as far as NVML tells it."""
    attr = f"PCI:{pci}" if pci else "PCI:unknown"
    if gpu_instance is not None:
        attr += f" GPU-I:{gpu_instance:02d}"
        if compute_instance is not None:
            attr += f" GPU-CI:{compute_instance:02d}"
    return f"NVRM: Xid ({attr}): {code}, (from NVML event)"


def _handle_key(handle: Any) -> Any:
    """A device handle's address (pynvml hands out a new pointer object for the same device each time)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


class NvmlXids:
    """A daemon thread waiting on an NVML event set; `drain()` hands its events to the agent's loop."""

    def __init__(self, nv: Any, devices: list[tuple[Any, str | None]], *, owns_init: bool) -> None:
        self.nv = nv
        self._owns_init = owns_init
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._parser = KernelLogParser()
        self._pci: dict[Any, str | None] = {}
        self._set = nv.nvmlEventSetCreate()
        for handle, bus_id in devices:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._set)
            except nv.NVMLError as exc:  # NotSupported on some boards and in some containers
                log.info("GPU %s: no NVML Xid events (%s)", bus_id, exc)
                continue
            self._pci[_handle_key(handle)] = pci_device(bus_id)

    @property
    def watching(self) -> int:
        return len(self._pci)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()

    def drain(self) -> list[Event]:
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        nv = self.nv
        failing = False
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._set, WAIT_MS)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError as exc:
                if not failing:
                    log.warning("waiting for NVML Xid events failed: %s (trying again every %g s)", exc, _ERROR_PAUSE_S)
                failing = True
                self._stop.wait(_ERROR_PAUSE_S)
                continue
            failing = False
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                self._events.put(self.event(data))

    def event(self, data: Any) -> Event:
        """The agent event of one NVML Xid event (an nvmlEventData_t)."""
        gi = data.gpuInstanceId if data.gpuInstanceId != _NO_INSTANCE else None
        ci = data.computeInstanceId if gi is not None and data.computeInstanceId != _NO_INSTANCE else None
        line = xid_line(int(data.eventData), self._pci.get(_handle_key(data.device)), gi, ci)
        (event,) = self._parser.feed(line, now=datetime.now(UTC))
        event.source = SOURCE
        return event

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * WAIT_MS / 1000)
            if self._thread.is_alive():
                return  # still inside a wait: freeing the set under it is not safe; the process exit frees it
        try:
            self.nv.nvmlEventSetFree(self._set)
            if self._owns_init:
                self.nv.nvmlShutdown()
        except self.nv.NVMLError as exc:
            log.debug("closing NVML events: %s", exc)


def open_nvml_xids(nvml: Nvml | None) -> NvmlXids | None:
    """Xid events of the GPUs `nvml` reads, or of every GPU through an NVML of its own; None when none answers."""
    if nvml is not None:
        devices = [(gpu.handle, g.pci_bus_id) for gpu, g in zip(nvml.gpus, nvml.inventory, strict=True)]
        return _watch(nvml.nv, devices, owns_init=False)
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as exc:  # ImportError, or no driver on this node
        log.info("no NVML Xid events: NVML is unavailable (%s)", exc)
        return None
    try:
        devices = []
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            bus_id = nv.nvmlDeviceGetPciInfo(handle).busId
            devices.append((handle, bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)))
    except nv.NVMLError as exc:
        log.info("no NVML Xid events: %s", exc)
        nv.nvmlShutdown()
        return None
    return _watch(nv, devices, owns_init=True)


def _watch(nv: Any, devices: list[tuple[Any, str | None]], *, owns_init: bool) -> NvmlXids | None:
    try:
        xids = NvmlXids(nv, devices, owns_init=owns_init)
    except (nv.NVMLError, AttributeError) as exc:  # an NVML (or nvidia-ml-py) without the event API
        log.info("no NVML Xid events: %s", exc)
        if owns_init:
            nv.nvmlShutdown()
        return None
    if not xids.watching:
        xids.close()
        return None
    return xids
