"""The host collector: CPU, memory, pressure, load, watched volumes, the NVIDIA driver and fabric manager,
and the kernel's machine-check and EDAC error counts.

Files read (proc(5); Documentation/accounting/psi.rst; Documentation/admin-guide/ras.rst for EDAC):
  {procfs}/stat                 "cpu  user nice system idle iowait irq softirq steal guest guest_nice" (ticks)
  {procfs}/loadavg, /meminfo    "0.52 0.58 0.59 1/467 12345"; "MemTotal:  2113442 kB"
  {procfs}/pressure/{cpu,memory,io}   "some avg10=0.12 avg60=... total=..." (+ a "full" line)
  {procfs}/interrupts           the "MCE:" row: machine check exceptions per CPU
  {procfs}/driver/nvidia/version      present when the NVIDIA kernel module is loaded
  {procfs}/driver/nvidia-nvswitch/devices/*, /dev/nvidia-nvswitch*   an NVSwitch host (needs nv-fabricmanager)
  {procfs}/<pid>/comm           process names (the fabric manager's, truncated to 15 characters)
  {sysfs}/devices/system/edac/mc/mc<N>/{ce_count,ue_count}
Whatever a host lacks (no PSI on older kernels or some VMs, no EDAC, no NVIDIA driver) is left out quietly.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from agents.counters import CounterTracker
from agents.kfiles import list_dir, read_int, read_text

log = logging.getLogger(__name__)

_MIB_PER_KIB = 1024
_MIN_TICKS_PER_CORE = 5
_PSI = (("cpu", "some", "psi_cpu_some_avg10"), ("memory", "some", "psi_mem_some_avg10"),
        ("memory", "full", "psi_mem_full_avg10"), ("io", "some", "psi_io_some_avg10"),
        ("io", "full", "psi_io_full_avg10"))  # fmt: skip
_AVG10 = re.compile(r"avg10=([0-9.]+)")
_DRIVER_VERSION = re.compile(r"Kernel Module(?: for [\w]+)?\s+([0-9][\w.-]*)")
# TASK_COMM_LEN is 16: "nv-fabricmanager" shows as "nv-fabricmanage".
_FABRIC_MANAGER_COMM = "nv-fabricmanager"[:15]
# /proc/driver/nvidia/gpus/<pci>/information: "Video BIOS: \t 96.00.99.00.01" (nv-procfs.c), the GPU firmware.
_VBIOS = re.compile(r"^Video BIOS:\s*(\S+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Jiffies of one /proc/stat cpu line: busy = total - idle - iowait."""

    total: int
    idle: int
    iowait: int
    steal: int


def parse_stat(text: str) -> tuple[CpuTimes | None, list[CpuTimes]]:
    """The aggregate `cpu` line and the per-core `cpuN` lines of /proc/stat."""
    total: CpuTimes | None = None
    cores: list[CpuTimes] = []
    for line in text.splitlines():
        if not line.startswith("cpu"):
            if cores:
                break  # the cpu lines come first
            continue
        name, *values = line.split()
        ticks = [int(v) for v in values[:8]] + [0] * (8 - min(8, len(values)))
        # user nice system idle iowait irq softirq steal; guest time is already inside user and nice.
        times = CpuTimes(total=sum(ticks), idle=ticks[3], iowait=ticks[4], steal=ticks[7])
        if name == "cpu":
            total = times
        else:
            cores.append(times)
    return total, cores


def cpu_percentages(
    before: tuple[CpuTimes | None, list[CpuTimes]], after: tuple[CpuTimes | None, list[CpuTimes]]
) -> dict[str, float]:
    """Utilisation, steal and iowait between two readings: the machine's and the worst core's."""
    out: dict[str, float] = {}
    (b, b_cores), (a, a_cores) = before, after
    # Under about 50 ms of ticks (USER_HZ 100) per core, a reading is mostly rounding: none is given.
    if a is None or b is None or a.total - b.total < _MIN_TICKS_PER_CORE * max(1, len(a_cores)):
        return out
    span = a.total - b.total
    out["cpu_util_pct"] = _pct(span - (a.idle - b.idle) - (a.iowait - b.iowait), span)
    out["cpu_steal_pct"] = _pct(a.steal - b.steal, span)
    out["cpu_iowait_pct"] = _pct(a.iowait - b.iowait, span)
    steal, iowait = [], []
    # Cores can go offline between readings; compare only when both readings have the same cores.
    if len(a_cores) == len(b_cores):
        for bc, ac in zip(b_cores, a_cores, strict=True):
            core_span = ac.total - bc.total
            if core_span > 0:
                steal.append(_pct(ac.steal - bc.steal, core_span))
                iowait.append(_pct(ac.iowait - bc.iowait, core_span))
    if steal:
        out["cpu_steal_max_core_pct"] = max(steal)
        out["cpu_iowait_max_core_pct"] = max(iowait)
    return out


_ZERO = CpuTimes(0, 0, 0, 0)


def _pct(part: int, whole: int) -> float:
    return round(min(100.0, max(0.0, 100.0 * part / whole)), 2)


def parse_meminfo(text: str) -> dict[str, float]:
    kib: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree"):
            kib[name] = int(rest.split()[0])
    out: dict[str, float] = {}
    if "MemTotal" in kib:
        out["mem_total_mib"] = round(kib["MemTotal"] / _MIB_PER_KIB, 1)
    if "MemAvailable" in kib:
        out["mem_available_mib"] = round(kib["MemAvailable"] / _MIB_PER_KIB, 1)
    if "SwapTotal" in kib and "SwapFree" in kib:
        out["swap_used_mib"] = round((kib["SwapTotal"] - kib["SwapFree"]) / _MIB_PER_KIB, 1)
    return out


def parse_psi(text: str) -> dict[str, float]:
    """{"some": avg10, "full": avg10} of one /proc/pressure file."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        match = _AVG10.search(rest)
        if match:
            out[kind] = float(match.group(1))
    return out


def mce_count(interrupts: str) -> int | None:
    """The sum over CPUs of the "MCE:" row of /proc/interrupts (None on hosts without one, e.g. arm64)."""
    for line in interrupts.splitlines():
        label, _, rest = line.strip().partition(":")
        if label == "MCE":
            total = 0
            for token in rest.split():
                if not token.isdigit():
                    break  # the description ("Machine check exceptions")
                total += int(token)
            return total
    return None


def driver_version(text: str) -> str | None:
    """ "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." -> "550.54.15"."""
    match = _DRIVER_VERSION.search(text)
    return match.group(1) if match else None


class HostCollector:
    """Reads the host once per call; CPU percentages are over the time since the previous call."""

    def __init__(
        self,
        procfs_root: str | os.PathLike[str] = "/proc",
        sysfs_root: str | os.PathLike[str] = "/sys",
        *,
        volumes: list[str] | None = None,
        tracker: CounterTracker | None = None,
    ) -> None:
        self.proc = os.fspath(procfs_root)
        self.sys = os.fspath(sysfs_root)
        self.volumes = [os.path.abspath(v) for v in volumes or []]
        self.tracker = tracker or CounterTracker()
        self._cpu: tuple[CpuTimes | None, list[CpuTimes]] | None = None
        self._fm_pid: str | None = None
        self._volume_missing: set[str] = set()
        # /dev is not under either root: look there only on the real host.
        self._real_dev = os.path.realpath(self.proc) == "/proc"

    def prime(self) -> None:
        """Take the first CPU reading, so the next read has percentages."""
        text = read_text(os.path.join(self.proc, "stat"))
        if text:
            self._cpu = parse_stat(text)

    def read(self, ts: str) -> list[dict[str, Any]]:
        """The `host` item and one `vol:<path>` item per watched volume."""
        fields: dict[str, float | int | None] = {}
        fields.update(self._cpu_fields())
        loadavg = read_text(os.path.join(self.proc, "loadavg"))
        if loadavg:
            fields["load1"] = float(loadavg.split()[0])
        meminfo = read_text(os.path.join(self.proc, "meminfo"))
        if meminfo:
            fields.update(parse_meminfo(meminfo))
        fields.update(self._psi())
        fields["nvidia_driver_loaded"] = int(os.path.exists(os.path.join(self.proc, "driver", "nvidia", "version")))
        if self.nvswitch_host():
            fields["fabric_manager_running"] = int(self._fabric_manager_running())
        fields.update(self._kernel_errors())
        items = [{"ts": ts, "subject": "host", "fields": fields}]
        for path in self.volumes:
            if (volume := self._volume(path)) is not None:
                items.append({"ts": ts, "subject": f"vol:{path}", "fields": volume})
        return items

    def facts(self) -> dict[str, str | None]:
        """Text facts for the heartbeat: the NVIDIA driver version, the kernel release and the GPUs' firmware."""
        version = read_text(os.path.join(self.proc, "driver", "nvidia", "version"))
        return {
            "driver_version": driver_version(version) if version else None,
            "kernel": read_text(os.path.join(self.proc, "sys", "kernel", "osrelease")),
            "firmware_version": self.vbios_version(),
        }

    def vbios_version(self) -> str | None:
        """The GPUs' video BIOS (firmware) version, from the driver's per-GPU information files; the most common
        one when they differ (a GPU flashed apart from the others is the exception, the node's version the rule)."""
        gpus = os.path.join(self.proc, "driver", "nvidia", "gpus")
        seen: dict[str, int] = {}
        for pci in list_dir(gpus):
            text = read_text(os.path.join(gpus, pci, "information"))
            match = _VBIOS.search(text or "")
            if match and match.group(1) != "??.??.??.??.??":  # what the driver prints when it cannot read it
                seen[match.group(1)] = seen.get(match.group(1), 0) + 1
        return max(sorted(seen), key=lambda v: seen[v]) if seen else None

    def fabric_manager_state(self) -> str | None:
        """The fabric manager on an NVSwitch host: "running" or "stopped" (None: no NVSwitch, nothing to manage).

        Read from /proc (its process, as `fabric_manager_running`), not from systemd: the agent runs in a container
        with the host's /proc but without its D-Bus, and a unit that is "active" while the process died says less.
        A GB200 compute tray has no local NVSwitch: its GPUs' fabric info says whether the global fabric manager on
        the switch trays still talks to them (agents/nvml_fabric.py, `gfm`)."""
        if not self.nvswitch_host():
            return None
        return "running" if self._fabric_manager_running() else "stopped"

    def nvswitch_host(self) -> bool:
        # The test NVIDIA's driver container applies before starting the fabric manager.
        if list_dir(os.path.join(self.proc, "driver", "nvidia-nvswitch", "devices")):
            return True
        return self._real_dev and bool(glob.glob("/dev/nvidia-nvswitch*"))

    # -- parts -----------------------------------------------------------------------------------

    def _cpu_fields(self) -> dict[str, float]:
        text = read_text(os.path.join(self.proc, "stat"))
        if not text:
            return {}
        now = parse_stat(text)
        before, self._cpu = self._cpu, now
        # Without an earlier reading, or with no tick between the two (a frozen fake tree), the counters since
        # boot still give the long-run figures.
        since_boot = (_ZERO, [_ZERO] * len(now[1]))
        return (before is not None and cpu_percentages(before, now)) or cpu_percentages(since_boot, now)

    def _psi(self) -> dict[str, float]:
        fields: dict[str, float] = {}
        parsed: dict[str, dict[str, float]] = {}
        for resource, kind, name in _PSI:
            if resource not in parsed:
                text = read_text(os.path.join(self.proc, "pressure", resource))
                parsed[resource] = parse_psi(text) if text else {}
            if kind in parsed[resource]:
                fields[name] = parsed[resource][kind]
        return fields

    def _fabric_manager_running(self) -> bool:
        # The pid found last time is checked first: a scan of every process only when it is gone.
        last = self._fm_pid
        if last is not None and read_text(os.path.join(self.proc, last, "comm")) == _FABRIC_MANAGER_COMM:
            return True
        self._fm_pid = None
        for pid in list_dir(self.proc):
            if pid.isdigit() and read_text(os.path.join(self.proc, pid, "comm")) == _FABRIC_MANAGER_COMM:
                self._fm_pid = pid
                return True
        return False

    def _kernel_errors(self) -> dict[str, int | float]:
        fields: dict[str, int | float] = {}
        interrupts = read_text(os.path.join(self.proc, "interrupts"))
        mce = mce_count(interrupts) if interrupts else None
        if mce is not None:
            fields["mce_events"] = self.tracker.wrapping("host", "mce_events", mce, 64)
        edac = os.path.join(self.sys, "devices", "system", "edac", "mc")
        controllers = [m for m in list_dir(edac) if m.startswith("mc") and m[2:].isdigit()]
        for name, file in (("edac_ce", "ce_count"), ("edac_ue", "ue_count")):
            values = [v for m in controllers if (v := read_int(os.path.join(edac, m, file))) is not None]
            if values:
                fields[name] = self.tracker.wrapping("host", name, sum(values), 64)
        return fields

    def _volume(self, path: str) -> dict[str, float | int] | None:
        try:
            st = os.statvfs(path)
        except OSError as exc:
            if path not in self._volume_missing:
                log.warning("watched volume %s cannot be read (%s); leaving it out until it can", path, exc)
                self._volume_missing.add(path)
            return None
        self._volume_missing.discard(path)
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize  # what a non-root writer (the training job) can still use
        return {
            "disk_free_bytes": free,
            "disk_total_bytes": total,
            "disk_free_pct": round(100.0 * free / total, 2) if total else None,
        }
