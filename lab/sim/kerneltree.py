"""A node's fake kernel tree: its host and network state rendered as the files the kernel would show under
/sys and /proc (formats from drivers/infiniband/core/sysfs.c, fs/proc/*.c, kernel/sched/psi.c, net-sysfs.c),
and a writer that keeps such a tree on disk, rewriting only the files whose text changed, atomically.

Paths are relative to the node's folder: `sys/...` is what the agent gets as `--sysfs-root`, `proc/...` as
`--procfs-root`. A path ending in "/" is a directory with nothing of ours in it (a netdev's `device` link,
which a fake tree carries as a plain directory).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lab.sim.dcgm_fields import MODEL_NAME
from lab.sim.fabric import PHYS_STATE_NAMES, STATE_NAMES, Fabric, Port, pcie_bus
from lab.sim.gpu import Gpu
from lab.sim.host import (
    DRIVER_BUILT,
    DRIVER_VERSION,
    GCC,
    INTERRUPT_PERIOD_S,
    INTERRUPT_ROWS,
    KERNEL_RELEASE,
    MEM_TOTAL_KIB,
    SWAP_TOTAL_KIB,
    VBIOS_VERSION,
    Host,
    Psi,
)

IB = "sys/class/infiniband"
NET = "sys/class/net"
EDAC = "sys/devices/system/edac/mc"
INTERRUPT_PREC = 4  # digits of the widest IRQ number (nr_irqs is in the thousands on these hosts)


class NodeTree:
    """Renders one node's tree; static files once, /proc/interrupts once per INTERRUPT_PERIOD_S."""

    def __init__(self, hostname: str, host: Host, fabric: Fabric, gpus: Sequence[Gpu] = ()) -> None:
        self.hostname, self.host, self.fabric, self.gpus = hostname, host, fabric, gpus
        self._static = self._render_static()
        self._interrupts: tuple[int, str] = (-1, "")

    def link_files(self) -> dict[str, str]:
        """The files the agent's port watch reads every sample tick (agents/port_watch.py): each port's state and
        link_downed, for a writer to bring up to date between the whole tree's syncs."""
        out = {}
        for port in (*self.fabric.ports, self.fabric.roce):
            base = f"{IB}/{port.device}/ports/1"
            out[f"{base}/state"] = f"{port.state}: {STATE_NAMES[port.state]}\n"
            if "link_downed" in port.counters:
                out[f"{base}/counters/link_downed"] = f"{port.counters['link_downed']}\n"
        return out

    def files(self) -> dict[str, str]:
        """Every file of the tree with its current text."""
        out = dict(self._static)
        if self.host.driver_version != DRIVER_VERSION:  # a rollout (lab/sim/shared_faults.py) replaced the driver
            out.update(_driver_files(self.host.driver_version))
        out.update(self.link_files())
        for port in (*self.fabric.ports, self.fabric.roce):
            base = f"{IB}/{port.device}/ports/1"
            out[f"{base}/phys_state"] = f"{port.phys_state}: {PHYS_STATE_NAMES[port.phys_state]}\n"
            for name, value in port.counters.items():
                out[f"{base}/counters/{name}"] = f"{value}\n"
            for name, value in port.hw.items():
                out[f"{base}/hw_counters/{name}"] = f"{value}\n"
        nic = self.fabric.nic
        for name, value in nic.statistics.items():
            out[f"{NET}/{nic.netdev}/statistics/{name}"] = f"{value}\n"
        # `ethtool -S` layout: a title line, then each counter indented by five spaces.
        out[f"{NET}/{nic.netdev}/ethtool_stats"] = "NIC statistics:\n" + "".join(
            f"     {name}: {value}\n" for name, value in nic.ethtool.items()
        )
        host = self.host
        for i, (ce, ue) in enumerate(zip(host.edac_ce, host.edac_ue, strict=True)):
            out[f"{EDAC}/mc{i}/ce_count"] = f"{ce}\n"
            out[f"{EDAC}/mc{i}/ue_count"] = f"{ue}\n"
        out["proc/stat"] = proc_stat(host)
        out["proc/meminfo"] = meminfo(host)
        out["proc/loadavg"] = loadavg(host)
        out["proc/pressure/cpu"] = pressure(host.psi_cpu)
        out["proc/pressure/memory"] = pressure(host.psi_mem)
        out["proc/pressure/io"] = pressure(host.psi_io)
        quantum = int(host.uptime // INTERRUPT_PERIOD_S)
        if quantum != self._interrupts[0]:
            self._interrupts = (quantum, interrupts(host, quantum * INTERRUPT_PERIOD_S))
        out["proc/interrupts"] = self._interrupts[1]
        return out

    def _render_static(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for port in (*self.fabric.ports, self.fabric.roce):
            out.update(_static_port(self.hostname, port))
        nic = self.fabric.nic
        out[f"{IB}/{self.fabric.roce.device}/device/net/{nic.netdev}/"] = ""
        net = f"{NET}/{nic.netdev}"
        out[f"{net}/device/vendor"] = "0x15b3\n"
        out[f"{net}/device/device"] = "0x1021\n"
        out.update(
            {
                f"{net}/address": f"{nic.mac}\n",
                f"{net}/operstate": "up\n",
                f"{net}/carrier": "1\n",
                f"{net}/speed": "200000\n",
                f"{net}/mtu": "9000\n",
                f"{net}/type": "1\n",
            }
        )
        # The loopback: a netdev without a `device`, which a collector of physical NICs must skip.
        for direction in ("rx", "tx"):
            for name in ("bytes", "packets", "errors", "dropped"):
                out[f"{NET}/lo/statistics/{direction}_{name}"] = "0\n"
        out.update({f"{NET}/lo/operstate": "unknown\n", f"{NET}/lo/type": "772\n", f"{NET}/lo/mtu": "65536\n"})
        for i in range(len(self.host.edac_ce)):
            out[f"{EDAC}/mc{i}/mc_name"] = f"Intel_10nm Socket#{i // 4} IMC#{i % 4}\n"
            out[f"{EDAC}/mc{i}/size_mb"] = f"{MEM_TOTAL_KIB // 1024 // len(self.host.edac_ce)}\n"
            out[f"{EDAC}/mc{i}/ce_noinfo_count"] = "0\n"
            out[f"{EDAC}/mc{i}/ue_noinfo_count"] = "0\n"
        out.update(_driver_files(DRIVER_VERSION))
        # The driver's entry per GPU it probed (one that later fell off the bus keeps it): what the all-reduce
        # check counts its ranks from.
        for gpu in self.gpus:
            location = f"0000:{gpu.bus:02x}:00.0"
            out[f"proc/driver/nvidia/gpus/{location}/information"] = (
                f"Model: \t\t {MODEL_NAME}\nGPU UUID: \t {gpu.uuid}\nVideo BIOS: \t {VBIOS_VERSION}\n"
                "Bus Type: \t PCIe\n"
                f"Bus Location: \t {location}\nDevice Minor: \t {gpu.index}\n"
            )
        out["proc/sys/kernel/osrelease"] = f"{KERNEL_RELEASE}\n"
        out["proc/version"] = (
            f"Linux version {KERNEL_RELEASE} (buildd@lcy02-amd64-079) ({GCC.removeprefix('gcc version ')}, "
            "GNU ld (GNU Binutils for Ubuntu) 2.38) #42-Ubuntu SMP Wed Nov 15 12:43:56 UTC 2023\n"
        )
        return out


def _driver_files(version: str) -> dict[str, str]:
    return {
        "sys/module/nvidia/version": f"{version}\n",
        "proc/driver/nvidia/version": (
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {DRIVER_BUILT}\nGCC version:  {GCC} \n"
        ),
    }


def _static_port(hostname: str, port: Port) -> dict[str, str]:
    dev = f"{IB}/{port.device}"
    g = port.guid
    guid = f"{g >> 48 & 0xFFFF:04x}:{g >> 32 & 0xFFFF:04x}:{g >> 16 & 0xFFFF:04x}:{g & 0xFFFF:04x}"
    bus = pcie_bus(port.gpu) if port.gpu is not None else 0xAA
    return {
        f"{dev}/node_type": "1: CA\n",
        f"{dev}/node_guid": f"{guid}\n",
        f"{dev}/sys_image_guid": f"{guid}\n",
        f"{dev}/node_desc": f"{hostname} {port.device}\n",
        f"{dev}/hca_type": "MT4129\n",
        f"{dev}/fw_ver": "28.39.1002\n",
        f"{dev}/board_id": "NVD0000000033\n",
        f"{dev}/device/vendor": "0x15b3\n",
        f"{dev}/device/device": "0x1021\n",
        f"{dev}/device/uevent": f"DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:{bus:02x}:00.0\n",
        f"{dev}/ports/1/link_layer": f"{port.link_layer}\n",
        f"{dev}/ports/1/rate": f"{port.rate}\n",
        f"{dev}/ports/1/lid": f"0x{port.lid:x}\n",
        f"{dev}/ports/1/sm_lid": "0x1\n" if port.link_layer == "InfiniBand" else "0x0\n",
        f"{dev}/ports/1/lid_mask_count": "0\n",
        f"{dev}/ports/1/sm_sl": "0\n",
        f"{dev}/ports/1/cap_mask": "0xa751e848\n" if port.link_layer == "InfiniBand" else "0x00010000\n",
    }


def _fixed2(x: float) -> str:
    # The kernel's LOAD_INT.LOAD_FRAC: two decimals, truncated.
    hundredths = int(max(0.0, x) * 100)
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def proc_stat(host: Host) -> str:
    """/proc/stat (fs/proc/stat.c): USER_HZ ticks per CPU; guest and guest_nice are 0 on a bare-metal host."""
    rows = [[int(v) for v in j] for j in host.jiffies]
    total = [sum(col) for col in zip(*rows, strict=True)]
    lines = ["cpu  " + " ".join(map(str, total)) + " 0 0"]
    lines += [f"cpu{c} " + " ".join(map(str, r)) + " 0 0" for c, r in enumerate(rows)]
    s = host.softirqs  # HI TIMER NET_TX NET_RX BLOCK IRQ_POLL TASKLET SCHED HRTIMER RCU
    softirq = [s, 0, s // 3, 0, s // 4, 0, 0, s // 8, 0, s // 5]
    lines += [
        f"intr {host.interrupts} 0 9 0 0 0 0 0 0 0 1 0 0 0",
        f"ctxt {host.ctxt}",
        f"btime {host.btime}",
        f"processes {host.forks}",
        f"procs_running {max(1, round(host.running))}",
        f"procs_blocked {round(host.blocked)}",
        f"softirq {sum(softirq[1:])} " + " ".join(map(str, softirq[1:])) + " 0",
    ]
    return "\n".join(lines) + "\n"


def meminfo(host: Host) -> str:
    """/proc/meminfo (fs/proc/meminfo.c): labels padded to 16 columns, values to 8, in kB."""
    free, cache, anon, kern = host.free_kib, host.cache_kib, host.anon_kib, host.kernel_kib
    swap_free = SWAP_TOTAL_KIB - host.swap_kib
    slab = kern // 2
    fields: list[tuple[str, int]] = [
        ("MemTotal", MEM_TOTAL_KIB), ("MemFree", free), ("MemAvailable", host.mem_available_kib),
        ("Buffers", cache // 200), ("Cached", cache), ("SwapCached", host.swap_kib // 20),
        ("Active", anon * 9 // 10 + cache // 2), ("Inactive", anon // 10 + cache // 2),
        ("Active(anon)", anon * 9 // 10), ("Inactive(anon)", anon // 10),
        ("Active(file)", cache // 2), ("Inactive(file)", cache // 2), ("Unevictable", 30_720), ("Mlocked", 30_720),
        ("SwapTotal", SWAP_TOTAL_KIB), ("SwapFree", swap_free), ("Dirty", 1_800), ("Writeback", 0),
        ("AnonPages", anon), ("Mapped", cache // 40), ("Shmem", 61_440),
        ("KReclaimable", kern // 3), ("Slab", slab), ("SReclaimable", kern // 3), ("SUnreclaim", slab - kern // 3),
        ("KernelStack", 98_304), ("PageTables", anon // 500), ("NFS_Unstable", 0), ("Bounce", 0),
        ("WritebackTmp", 0), ("CommitLimit", MEM_TOTAL_KIB // 2 + SWAP_TOTAL_KIB), ("Committed_AS", anon * 5 // 4),
        ("VmallocTotal", 34_359_738_367), ("VmallocUsed", 1_290_240), ("VmallocChunk", 0), ("Percpu", 436_224),
    ]  # fmt: skip
    lines = [f"{name + ':':<16}{value:>8} kB" for name, value in fields]
    lines.append("HardwareCorrupted:     0 kB")
    lines += [f"{name + ':':<16}{value:>8} kB" for name, value in (
        ("AnonHugePages", anon // 3), ("ShmemHugePages", 0), ("ShmemPmdMapped", 0), ("FileHugePages", 0),
        ("FilePmdMapped", 0),
    )]  # fmt: skip
    lines += [f"HugePages_{name}:   {0:>5}" for name in ("Total", "Free", "Rsvd", "Surp")]
    lines += [
        f"{'Hugepagesize:':<16}{2048:>8} kB",
        f"{'Hugetlb:':<16}{0:>8} kB",
        f"{'DirectMap4k:':<16}{1_253_932:>8} kB",
        f"{'DirectMap2M:':<16}{47_794_176:>8} kB",
        f"{'DirectMap1G:':<16}{2_099_249_152:>8} kB",
    ]
    return "\n".join(lines) + "\n"


def loadavg(host: Host) -> str:
    """/proc/loadavg: three load averages, runnable/total scheduling entities, the last pid."""
    running = max(1, round(host.running))
    return f"{' '.join(_fixed2(a) for a in host.load)} {running}/{host.threads} {host.last_pid}\n"


def pressure(psi: Psi) -> str:
    """One /proc/pressure file (kernel/sched/psi.c psi_show)."""
    lines = []
    for kind, avg, total in (("some", psi.some_avg, psi.some_total), ("full", psi.full_avg, psi.full_total)):
        a10, a60, a300 = (_fixed2(a) for a in avg)
        lines.append(f"{kind} avg10={a10} avg60={a60} avg300={a300} total={total}\n")
    return "".join(lines)


def interrupts(host: Host, at: float) -> str:
    """/proc/interrupts (kernel/irq/proc.c, arch/x86/kernel/irq.c) at uptime `at`, a few rows of the real many."""
    prec = INTERRUPT_PREC
    lines = [" " * (prec + 8) + "".join(f"CPU{c:<8d}" for c in range(host.cpus))]
    for (label, _, desc), rates, static in zip(INTERRUPT_ROWS, host.irq_rates, host.irq_static, strict=True):
        counts = "".join(f"{s + int(r * at):10d} " for r, s in zip(rates, static, strict=True))
        sep = " " if label.isdigit() else "  "
        lines.append(f"{label:>{prec}}: {counts}{sep}{desc}")
    lines.append(f"{'ERR':>{prec}}: {0:10d}")
    lines.append(f"{'MIS':>{prec}}: {0:10d}")
    return "\n".join(lines) + "\n"


class TreeWriter:
    """Keeps a tree of files under `root` equal to the last `sync`: only changed files are rewritten, each
    atomically (written beside the tree, then renamed into place), so a reader never sees half a file."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._tmp = os.path.join(self.root, ".tree.tmp")
        self._last: dict[str, str] = {}
        self._dirs: set[str] = set()

    def sync(self, files: Mapping[str, str]) -> int:
        """Bring the tree up to date; returns how many files were written."""
        written = 0
        last, join = self._last, os.path.join
        for rel, text in files.items():
            if last.get(rel) == text:
                continue
            path = join(self.root, rel)
            if rel.endswith("/"):
                os.makedirs(path, exist_ok=True)
                last[rel] = text
                continue
            parent = os.path.dirname(path)
            if parent not in self._dirs:
                os.makedirs(parent, exist_ok=True)
                self._dirs.add(parent)
            with open(self._tmp, "w", encoding="ascii") as f:
                f.write(text)
            os.replace(self._tmp, path)
            last[rel] = text
            written += 1
        return written
