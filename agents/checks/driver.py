"""Driver state from NVML, through the agent's own reader (agents/nvml.py): what a GPU's counters say about it at
rest, before any load is put on it.

One result per GPU, failing on what NVIDIA's guidance treats as a GPU to reset or replace (the GPU memory error
management and Xid documents): a row remap pending (reset the GPU) or failed (replace it), a page retirement
pending or for double-bit errors, a volatile double-bit ECC error, a PCIe link narrower than its maximum, clocks
held back by thermal or power-brake hardware, an NVLink that was up and is down, and a GPU that answers nothing.
A PCIe generation below the maximum is evidence only: an idle GPU trains its link down to save power.

The driver's own recovery action (NVML's GPU recovery action field, drivers 550 and later) fails a GPU too: after
an Xid such as 119 or 120 (a GSP timeout) the driver says whether the GPU needs a reset or the node a reboot.

Xid events since boot: NVML keeps no history of them, so the kernel log is read whole through the agent's own
parser (agents/parsers/kernel.py): the one the agent follows (--kmsg: a device, a kern.log file or journald), by
default the /dev/kmsg ring buffer, else `journalctl -k -b`. Each GPU's Xids are listed in its evidence with their
catalog mnemonic and action; "n/a" when no log can be read (a container without /dev/kmsg or journald, or
--kmsg none). They are evidence, not a verdict: an Xid before a reset or a reboot's repair says nothing of the
GPU now, and the service already acted on each when it happened.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents.checks.result import CheckResult, not_available
from agents.nvml import LINKS_DOWN, SLOWDOWN_FLAGS, Nvml, clock_event_flags, open_nvml
from agents.parsers.kernel import KernelLogParser

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
RECOVERY_ACTION = "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"  # the NVML field: what the driver asks for
# NVML_GPU_RECOVERY_ACTION_* -> (what the driver asks for, the action it calls for; None: a person decides).
_RECOVERY: dict[int, tuple[str, str | None]] = {
    1: ("a GPU reset", "reset_gpu"),
    2: ("a node reboot", "reboot"),
    3: ("a drain of its peer-to-peer traffic", None),
    4: ("a drain and a GPU reset", "reset_gpu"),
    5: ("a recovery of its IMEX domain", None),
    6: ("a bus reset", "reset_gpu"),
    7: ("a system reboot", "reboot"),
}
_ACTION_ORDER = ("replace", "reboot", "reset_gpu")  # the strongest first
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
    RECOVERY_ACTION,
)


def judge(fields: dict[str, float | None]) -> tuple[list[str], str | None]:
    """(problems found, the strongest action they call for: replace > reboot > reset_gpu) in one GPU's NVML
    fields."""
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
    recovery = fields.get(RECOVERY_ACTION)
    if recovery:
        what, wanted = _RECOVERY.get(int(recovery), (f"recovery action {recovery:g}", None))
        problems.append(f"the driver asks for {what}")
        if wanted is not None:
            actions.add(wanted)
    action = next((a for a in _ACTION_ORDER if a in actions), None)
    return problems, action


KMSG = "/dev/kmsg"
JOURNALCTL = ("journalctl", "-k", "-b", "--no-pager", "-o", "short-iso")
KERNEL_LOG_TIMEOUT_S = 10.0
KERNEL_LOG_MAX_BYTES = 64 << 20
MAX_XIDS_PER_GPU = 50  # the most recent; a flapping link can log thousands


def read_kmsg(path: str = KMSG) -> list[str] | None:
    """Every record left in the kernel's ring buffer (since boot unless it wrapped); None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines: list[str] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten while reading: the next read goes on from the oldest left
                break
            if not record:
                break
            lines.append(record.decode("utf-8", "replace").rstrip("\n"))
    finally:
        os.close(fd)
    return lines


def read_file(path: str, *, max_bytes: int = KERNEL_LOG_MAX_BYTES) -> list[str] | None:
    """The lines of a kernel log file (dmesg output, kern.log), its last `max_bytes` at most (a kern.log spans
    reboots; the newest lines are this boot's); None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if size > max_bytes else lines  # the first line was cut


def read_journal() -> list[str] | None:
    """The kernel's messages of this boot from journald; None when journalctl is absent or fails."""
    try:
        done = subprocess.run(JOURNALCTL, capture_output=True, text=True, timeout=KERNEL_LOG_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines() if done.returncode == 0 else None


Source = Callable[[], list[str] | None]


def sources_for(kernel_log: str) -> tuple[Source, ...]:
    """Where the kernel log is read, for the agent's --kmsg: "auto" (/dev/kmsg, else journald), "none",
    "journald", a character device such as /dev/kmsg, or a file (dmesg output, kern.log)."""
    if kernel_log == "auto":
        return (read_kmsg, read_journal)
    if kernel_log == "none":
        return ()
    if kernel_log == "journald":
        return (read_journal,)
    try:
        device = stat.S_ISCHR(os.stat(kernel_log).st_mode)
    except OSError:
        device = False
    return (lambda: read_kmsg(kernel_log),) if device else (lambda: read_file(kernel_log),)


def xids_since_boot(
    sources: tuple[Source, ...] = (read_kmsg, read_journal),
) -> dict[str, list[dict[str, Any]]] | None:
    """PCI bus ("0000:9d:00") -> the Xids the kernel logged for that GPU since boot; None when no source answers."""
    lines = None
    for source in sources:
        lines = source()
        if lines is not None:
            break
    if lines is None:
        return None
    now = datetime.now(UTC)
    parser = KernelLogParser()
    events = [e for line in lines for e in parser.feed(line, now=now)] + parser.flush(now=now)
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event.kind != "xid" or not event.fields.get("pci"):
            continue
        item = {
            "ts": event.ts.isoformat(),
            "xid": event.fields.get("xid"),
            "mnemonic": event.fields.get("mnemonic"),
            "action": event.fields.get("action"),
        }
        out.setdefault(_bus(event.fields["pci"]), []).append(item)
    return {bus: items[-MAX_XIDS_PER_GPU:] for bus, items in out.items()}


def _bus(pci: str) -> str:
    """NVML's "00000000:9D:00.0" and the kernel's "0000:9d:00" to one key: domain (4 digits):bus:device."""
    domain, _, rest = pci.lower().partition(":")
    return f"{domain[-4:]}:{rest[:5]}"


def recovery_action(nv: Any, handle: Any) -> dict[str, float | None]:
    """The GPU's recovery action as a field ({RECOVERY_ACTION: value}, None when the GPU does not answer); empty
    where the driver or nvidia-ml-py does not offer it."""
    field, get = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None), getattr(nv, "nvmlDeviceGetFieldValues", None)
    if field is None or get is None:
        return {}
    absent = tuple(getattr(nv, n) for n in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound") if hasattr(nv, n))
    try:
        [value] = get(handle, [field])
    except absent:
        return {}
    except nv.NVMLError:
        return {RECOVERY_ACTION: None}
    if value.nvmlReturn != 0:  # not NVML_SUCCESS: a driver older than the field
        return {}
    return {RECOVERY_ACTION: float(value.value.uiVal)}


def results_from(reader: Nvml, *, xids: dict[str, list[dict[str, Any]]] | None = None) -> list[CheckResult]:
    """One result per GPU from one full read (every slow reading included), with the Xids since boot (None: n/a)."""
    reader.slow_period = 0.0
    started = time.monotonic()
    readings = reader.read()
    recovery = [recovery_action(reader.nv, gpu.handle) for gpu in reader.gpus]
    took = round(time.monotonic() - started, 3)
    out = []
    for reading, extra in zip(readings, recovery, strict=True):
        fields = {**reading.fields, **extra}
        problems, action = judge(fields)
        evidence: dict[str, Any] = {"model": reading.model, "uuid": reading.uuid, "pci_bus_id": reading.pci_bus_id}
        evidence["fields"] = {k: fields[k] for k in _EVIDENCE if fields.get(k) is not None}
        evidence["clock_event_reasons"] = clock_event_flags(reading.fields.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
        evidence["xid_since_boot"] = "n/a" if xids is None else xids.get(_bus(reading.pci_bus_id or ""), [])
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


def run(*, kernel_log: str = "auto") -> list[CheckResult]:
    """Every GPU's driver state, with the Xids since boot from `kernel_log` (the agent's --kmsg)."""
    reader = open_nvml()
    if reader is None:
        return [not_available(CHECK, "NVML is unavailable (no NVIDIA driver, or no GPU)")]
    try:
        return results_from(reader, xids=xids_since_boot(sources_for(kernel_log)))
    finally:
        reader.close()
