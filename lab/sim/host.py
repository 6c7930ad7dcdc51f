"""One simulated node's host: CPUs, memory, pressure stall information, load, interrupts, EDAC, driver.

The numbers are a DGX H100's (two 56-core Xeons with hyper-threading: 224 CPUs, 2 TiB of memory) running
one training job: eight rank threads busy on their cores, data-loader workers on others, the rest mostly
idle; most memory in the page cache. `step` advances them by `dt` seconds with healthy noise; the
memory-pressure fault ramps `pressure` from 0 to 1, which eats the available memory, pushes pages to swap
and makes tasks stall (PSI, iowait, blocked tasks). Rendering into /proc files is lab/sim/kerneltree.py.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from lab.sim.fabric import count

CPUS = 224
USER_HZ = 100  # /proc/stat counts in USER_HZ ticks
RANK_CORES = 8  # one busy main thread per rank
LOADER_CORES = 48  # data-loader workers
MEM_TOTAL_KIB = 2_113_389_432
SWAP_TOTAL_KIB = 8_388_604
MEM_PRESSURE_RAMP_S = 25.0  # from healthy to nearly exhausted
AVAILABLE_FLOOR = 0.02  # MemAvailable under pressure, as a share of MemTotal
# How much slower a node's ranks compute under full memory pressure (page faults, swap-ins in the loaders):
# with 72% of a step computing, 1.28x compute makes the whole synchronous job ~20% slower.
MEM_PRESSURE_SLOWDOWN = 1.28
KERNEL_RELEASE = "5.15.0-1042-nvidia"
# An H100 SXM5's video BIOS (firmware), as /proc/driver/nvidia/gpus/*/information shows it.
VBIOS_VERSION = "96.00.89.00.01"
GCC = "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)"
DRIVER_VERSION = "550.90.07"
DRIVER_BUILT = "Fri May 31 09:35:42 UTC 2024"
EDAC_CONTROLLERS = 8  # four integrated memory controllers per socket
INTERRUPT_PERIOD_S = 10.0  # /proc/interrupts counts move in steps of this (keeps the large file cheap)

# The rows of /proc/interrupts kept (of hundreds): (label, per-CPU rate per second, description).
INTERRUPT_ROWS: tuple[tuple[str, float, str], ...] = (
    ("0", 0.0, "IR-IO-APIC    2-edge      timer"),
    ("8", 0.0, "IR-IO-APIC    8-edge      rtc0"),
    ("9", 0.0, "IR-IO-APIC    9-fasteoi   acpi"),
    ("NMI", 0.02, "Non-maskable interrupts"),
    ("LOC", 250.0, "Local timer interrupts"),
    ("SPU", 0.0, "Spurious interrupts"),
    ("PMI", 0.02, "Performance monitoring interrupts"),
    ("IWI", 0.5, "IRQ work interrupts"),
    ("RTR", 0.0, "APIC ICR read retries"),
    ("RES", 40.0, "Rescheduling interrupts"),
    ("CAL", 12.0, "Function call interrupts"),
    ("TLB", 3.0, "TLB shootdowns"),
    ("TRM", 0.0, "Thermal event interrupts"),
    ("THR", 0.0, "Threshold APIC interrupts"),
    ("DFR", 0.0, "Deferred Error APIC interrupts"),
    ("MCE", 0.0, "Machine check exceptions"),
    ("MCP", 1 / 300, "Machine check polls"),
)


@dataclass
class Psi:
    """One /proc/pressure file: cumulative stall time (us) and the kernel's running averages (percent)."""

    some_total: int = 0
    full_total: int = 0
    some_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)  # avg10, avg60, avg300
    full_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def step(self, dt: float, some_pct: float, full_pct: float) -> None:
        self.some_total += int(some_pct / 100 * dt * 1e6)
        self.full_total += int(full_pct / 100 * dt * 1e6)
        self.some_avg = _ema(self.some_avg, some_pct, dt)
        self.full_avg = _ema(self.full_avg, full_pct, dt)


def _ema(avg: tuple[float, float, float], pct: float, dt: float) -> tuple[float, float, float]:
    # The kernel's exponentially decaying averages over 10, 60 and 300 seconds (kernel/sched/psi.c).
    out = []
    for window, a in zip((10.0, 60.0, 300.0), avg, strict=True):
        e = math.exp(-dt / window)
        out.append(a * e + pct * (1 - e))
    return out[0], out[1], out[2]


class Host:
    """The host side of one node; `step` moves it `dt` seconds on, `training` being the share of busy ranks."""

    def __init__(self, node: int, rng: random.Random) -> None:
        self.node = node
        self.cpus = CPUS
        uptime = 3 * 3600 + rng.random() * 40 * 3600
        self.uptime = uptime
        self.btime = 0  # boot time, seconds since the epoch: the cluster sets it from its start time
        # Per-CPU base load: rank threads, loader workers, and the cores that take the NICs' interrupts.
        self.busy = [0.0] * CPUS
        cores = rng.sample(range(CPUS), RANK_CORES + LOADER_CORES)
        for c in cores[:RANK_CORES]:
            self.busy[c] = 0.96
        for c in cores[RANK_CORES:]:
            self.busy[c] = 0.25 + 0.2 * rng.random()
        self.irq_cores = frozenset(rng.sample(range(CPUS), 16))
        # Cores whose tasks would block on I/O (swap-ins, page-cache refills) when memory runs out.
        self.io_cores = frozenset(rng.sample(range(CPUS), 60))
        # [user, nice, system, idle, iowait, irq, softirq, steal] in USER_HZ ticks since boot.
        self.jiffies = [self._since_boot(c, uptime, rng) for c in range(CPUS)]
        self.cpu_some_base = 0.3 + 2.0 * rng.random()  # run-queue contention: per-node, stable
        self.io_some_base = 0.05 + 0.25 * rng.random()
        self.anon_kib = int(MEM_TOTAL_KIB * (0.14 + 0.06 * rng.random()))
        self.cache_kib = int(MEM_TOTAL_KIB * (0.45 + 0.2 * rng.random()))
        self.kernel_kib = int(MEM_TOTAL_KIB * (0.018 + 0.004 * rng.random()))
        self.healthy_anon, self.healthy_cache = self.anon_kib, self.cache_kib
        self.swap_kib = rng.choice((0, 0, 0, 1024 * rng.randrange(20, 300)))
        self.healthy_swap = self.swap_kib
        self.pressure = 0.0  # 0 healthy .. 1 memory nearly exhausted
        self.pressure_target = 0.0
        # How bad the stalls get once memory runs out: set per fault (incidents differ).
        self.mem_stall = 40.0
        self.io_stall = 18.0
        self.psi_cpu, self.psi_mem, self.psi_io = Psi(), Psi(), Psi()
        self.psi_cpu.some_total = int(uptime * 1e6 * self.cpu_some_base / 100)
        self.psi_io.some_total = int(uptime * 1e6 * self.io_some_base / 100)
        self.psi_io.full_total = self.psi_io.some_total // 3
        self.psi_cpu.some_avg = (self.cpu_some_base,) * 3
        self.psi_io.some_avg = (self.io_some_base,) * 3
        self.psi_io.full_avg = (self.io_some_base / 3,) * 3
        self.running = sum(self.busy)
        self.blocked = 0.0
        self.load = (self.running, self.running, self.running)
        self.threads = 2900 + rng.randrange(400)
        self.last_pid = 100000 + rng.randrange(200000)
        self.forks = self.last_pid + rng.randrange(10**6)
        self.ctxt = int(uptime * 2.1e5)
        self.interrupts = int(uptime * 6.5e4)
        self.softirqs = int(uptime * 4.0e4)
        # Interrupt rows: per-CPU counts at boot-relative time 0 and per-CPU rates.
        self.irq_rates = [
            [rate * (0.5 + rng.random()) if rate else 0.0 for _ in range(CPUS)] for _, rate, _ in INTERRUPT_ROWS
        ]
        self.irq_static = [
            [rng.randrange(0, 3) if label.isdigit() else 0 for _ in range(CPUS)] for label, _, _ in INTERRUPT_ROWS
        ]
        # An old, long-handled machine check on some hosts: a level, never a rise, on a healthy node.
        mce_row = [label for label, _, _ in INTERRUPT_ROWS].index("MCE")
        if rng.random() < 0.2:
            self.irq_static[mce_row][rng.randrange(CPUS)] = 1
        # Realism and the software fault: storage I/O the node waits on (0..1, a checkpoint save), and cores a
        # runaway process keeps busy whatever the training does.
        self.io_load = 0.0
        self.hog: frozenset[int] = frozenset()
        self.edac_ce = [rng.choice((0, 0, 0, 0, 0, 0, 1, 4)) for _ in range(EDAC_CONTROLLERS)]
        self.edac_ue = [0] * EDAC_CONTROLLERS
        self.driver_loaded = True
        self.driver_version = DRIVER_VERSION  # a rollout (lab/sim/shared_faults.py) changes it

    def _since_boot(self, c: int, uptime: float, rng: random.Random) -> list[float]:
        ticks = uptime * USER_HZ
        b = self.busy[c] * 0.8 + 0.006  # not always training since boot
        soft = 0.02 if c in self.irq_cores else 0.001
        idle = 1 - b - soft - 0.0006
        return [ticks * b * 0.9, 0.0, ticks * b * 0.1, ticks * idle, ticks * 0.0005, ticks * 0.0001, ticks * soft, 0.0]

    @property
    def slowdown(self) -> float:
        """Factor on the compute time of this node's ranks."""
        return 1.0 + (MEM_PRESSURE_SLOWDOWN - 1.0) * _smooth(self.pressure)

    @property
    def mem_available_kib(self) -> int:
        return self.free_kib + int(self.cache_kib * 0.92) + self.kernel_kib // 3

    @property
    def free_kib(self) -> int:
        return max(0, MEM_TOTAL_KIB - self.anon_kib - self.cache_kib - self.kernel_kib)

    def step(self, dt: float, training: float, rng: random.Random) -> None:
        self.uptime += dt
        self._step_pressure(dt)
        p = _smooth(self.pressure)
        self._step_cpus(dt, training, p, rng)
        self._step_memory(dt, p, rng)
        noise = math.exp(rng.gauss(0, 0.25))
        cpu_some = (self.cpu_some_base * training + 0.05) * noise + 4.0 * p
        mem_some = p**1.5 * self.mem_stall * math.exp(rng.gauss(0, 0.1)) if p > 0 else 0.0
        io_some = (self.io_some_base * math.exp(rng.gauss(0, 0.4))) + p * self.io_stall
        if self.io_load:
            io_some += self.io_load * 6.0 * math.exp(rng.gauss(0, 0.2))
        if self.hog:  # runnable tasks queue behind the hog on its cores
            cpu_some += len(self.hog) / self.cpus * 60.0
        self.psi_cpu.step(dt, min(100.0, cpu_some), 0.0)  # system-wide cpu "full" is always 0
        self.psi_mem.step(dt, min(100.0, mem_some), min(100.0, mem_some * 0.45))
        self.psi_io.step(dt, min(100.0, io_some), min(100.0, io_some * 0.35))
        self.blocked = p * 40 * math.exp(rng.gauss(0, 0.2)) + (1 if rng.random() < 0.05 else 0)
        self.running = sum(self.busy) * training + 2 + rng.gauss(0, 1.5)
        if self.hog:
            self.running += len(self.hog)
        n = max(0.0, self.running + self.blocked)  # Linux load counts uninterruptible tasks
        self.load = tuple(
            a * math.exp(-dt / w) + n * (1 - math.exp(-dt / w)) for a, w in zip(self.load, (60, 300, 900), strict=True)
        )  # type: ignore[assignment]
        forks = count(rng, 3 * dt)
        self.last_pid += forks
        self.forks += forks
        self.threads += rng.randint(-2, 2)
        self.ctxt += int(2.1e5 * dt * (1 + rng.gauss(0, 0.05)))
        self.interrupts += int(6.5e4 * dt * (1 + rng.gauss(0, 0.05)))
        self.softirqs += int(4.0e4 * dt * (1 + rng.gauss(0, 0.05)))

    def _step_pressure(self, dt: float) -> None:
        delta = dt / MEM_PRESSURE_RAMP_S
        if self.pressure < self.pressure_target:
            self.pressure = min(self.pressure_target, self.pressure + delta)
        elif self.pressure > self.pressure_target:
            self.pressure = max(self.pressure_target, self.pressure - 4 * delta)

    def _step_cpus(self, dt: float, training: float, p: float, rng: random.Random) -> None:
        ticks = USER_HZ * dt
        gauss = rng.gauss
        hog, io_load = self.hog, self.io_load
        for c in range(CPUS):
            j = self.jiffies[c]
            busy = min(0.995, (self.busy[c] * training) * math.exp(gauss(0, 0.06)) + 0.004 + 0.004 * rng.random())
            if hog and c in hog:
                busy = 0.99
            io_core = c in self.io_cores
            iowait = (0.55 * p * rng.random() if io_core else 0.02 * p) + (0.002 * rng.random() if io_core else 0.0)
            if io_load and io_core:  # a checkpoint's writes: a little iowait where the writers run
                iowait += 0.04 * io_load
            system = busy * 0.1 + (0.08 * p if io_core else 0.0)  # direct reclaim runs in the kernel
            soft = 0.02 if c in self.irq_cores else 0.0005
            iowait = min(iowait, max(0.0, 1 - busy - soft - 0.0002))
            j[0] += ticks * busy * 0.9
            j[2] += ticks * system
            j[4] += ticks * iowait
            j[5] += ticks * 0.0001
            j[6] += ticks * soft
            j[3] += ticks * max(0.0, 1 - busy * 0.9 - system - iowait - 0.0001 - soft)

    def _step_memory(self, dt: float, p: float, rng: random.Random) -> None:
        total = MEM_TOTAL_KIB
        # Healthy: the job's heap breathes a little, the page cache follows the data being read.
        self.healthy_anon = int(self.healthy_anon * (1 + rng.gauss(0, 0.0008)))
        self.healthy_cache = int(min(total * 0.7, max(total * 0.3, self.healthy_cache * (1 + rng.gauss(0, 0.001)))))
        if p <= 0:
            self.anon_kib, self.cache_kib, self.swap_kib = self.healthy_anon, self.healthy_cache, self.healthy_swap
            return
        # Pressure: something's heap grows until the cache is squeezed out and MemAvailable is ~2% of total.
        floor = total * AVAILABLE_FLOOR * (1 + rng.gauss(0, 0.04))
        self.cache_kib = int(self.healthy_cache * (1 - p) + total * 0.012 * p)
        healthy_avail = total - self.healthy_anon - self.healthy_cache * 0.08 - self.kernel_kib * 2 / 3
        available = healthy_avail * (1 - p) + floor * p
        free = max(total * 0.004, available - self.cache_kib * 0.92 - self.kernel_kib // 3)
        self.anon_kib = int(total - free - self.cache_kib - self.kernel_kib)
        if p > 0.5:  # anonymous pages go to swap once the cache is mostly gone
            swapped = int(90_000 * dt * p * (1 + rng.gauss(0, 0.2)))
            self.swap_kib = min(int(SWAP_TOTAL_KIB * 0.85), self.swap_kib + swapped)

    def start_memory_pressure(self, rng: random.Random) -> None:
        self.pressure_target = 1.0
        self.mem_stall = 20.0 + 40.0 * rng.random()
        self.io_stall = 10.0 + 15.0 * rng.random()

    def start_cpu_hog(self, cores: int, rng: random.Random) -> None:
        """A runaway process (a data-loader worker spinning) takes `cores` otherwise idle cores."""
        idle = [c for c in range(self.cpus) if self.busy[c] == 0.0]
        self.hog = frozenset(rng.sample(idle, min(cores, len(idle))))

    def stop_cpu_hog(self) -> None:
        self.hog = frozenset()

    def repair(self) -> None:
        self.stop_cpu_hog()
        self.io_load = 0.0
        self.pressure_target = self.pressure = 0.0
        self.swap_kib = self.healthy_swap

    def reboot(self) -> None:
        """The repair shop rebooted it: the kernel's pressure averages (/proc/pressure's avg10, avg60, avg300) start
        again from nothing, where a repair in place leaves them to decay over the next minute."""
        for psi in (self.psi_cpu, self.psi_mem, self.psi_io):
            psi.some_avg = psi.full_avg = (0.0, 0.0, 0.0)


def _smooth(x: float) -> float:
    x = min(1.0, max(0.0, x))
    return x * x * (3 - 2 * x)
