"""The simulated cluster as a pure, deterministic state machine.

`Cluster(config).advance(t)` moves simulated time forward in fixed ticks and returns the log lines written
meanwhile; `snapshot()` gives every live GPU's DCGM field values; `control_text(node)` tells the rank
processes of a node what to do. No I/O, no wall clock: the same seed gives the same cluster, whatever
the pattern of calls, which is what makes scenarios testable in milliseconds.

The job is one synchronous data-parallel training run: every step each rank computes (its GPU busy:
tensor cores, DRAM, high power), waits for the slowest rank (NCCL kernels spinning: utilization 100%
but SMs idle), then all-reduces (NVLink and PCIe traffic). A throttled GPU makes every rank wait longer;
a lost GPU or a dead rank leaves the others spinning in the collective until the watchdog fires.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agents.sim import dcgm_fields as F
from agents.sim import logformat as fmt
from agents.sim.config import SimConfig
from agents.sim.gpu import (
    COMM,
    COMPUTE,
    COMPUTE_SHARE,
    IDLE,
    NONE,
    SPIN,
    THROTTLE_RATIO,
    TICK,
    WAIT,
    Gpu,
    GpuSample,
)
from agents.sim.scenarios import FAULT_KINDS, SCENARIOS, FaultSpec

NVLINK_COMM_FACTOR = 1.8  # NVLink replays stretch the all-reduce
COLLECTIVES_PER_STEP = 4  # NCCL SeqNum advances this much per step
BUCKET_NUMEL = 126353408
GLOBAL_BATCH = 1024
TOTAL_ITERS = 500000
IB_FLAP_STALL = 6.0  # seconds the first flap stalls the job
IB_SECOND_FLAP = 40.0  # the link drops again this long after the first flap, for good

# Rank modes (what the rank processes are told to do, and what the model assumes they do).
NORMAL, VICTIM, CULPRIT_DATA, CULPRIT_SYNC, TERMINATED, ABORT = (
    "normal",
    "hang_victim",
    "hang_culprit:data",
    "hang_culprit:sync",
    "terminated",
    "abort",
)
CRASH_ECC, CRASH_USER, CRASH_NCCL = "crash:ecc", "crash:user_bug", "crash:nccl"
DEAD = frozenset({TERMINATED, ABORT, CRASH_ECC, CRASH_USER, CRASH_NCCL})


@dataclass(frozen=True)
class LogLine:
    node: str
    stream: str  # "kern" or "train"
    text: str  # may hold several lines (a multi-line kernel record, a traceback)


@dataclass
class FaultRecord:
    kind: str
    nodes: list[str]
    gpus: dict[str, list[int]]
    ranks: list[int]
    injected_at: datetime
    blame: str
    expect_eviction: bool
    t: float
    repaired_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "ranks": self.ranks,
            "injected_at": self.injected_at.isoformat(),
            "blame": self.blame,
            "expect_eviction": self.expect_eviction,
        }
        if self.repaired_at is not None:
            out["repaired_at"] = self.repaired_at.isoformat()
        return out


@dataclass
class Job:
    step: int
    seq: int
    state: str = "running"  # running | hung | failed
    phase: float = 0.0  # seconds into the current step
    started_at: float = 0.0  # sim time the current step started
    compute: list[float] = field(default_factory=list)  # per rank: compute time of this step
    compute_max: float = 0.0
    duration: float = 0.0
    comm_factor: float = 1.0
    stall_until: float = 0.0
    nan: bool = False
    nan_iters: int = 0
    loss_drift: float = 0.0


class Cluster:
    def __init__(self, config: SimConfig) -> None:
        config = config.resolved()
        if config.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {config.scenario!r}; known: {', '.join(SCENARIOS)}")
        assert config.start is not None and config.seed is not None
        self.config = config
        self.start: datetime = config.start
        self.rng = random.Random(config.seed)
        # The plan draws from its own stream, so adding noise to the physics never moves a fault.
        self._plan: Iterator[FaultSpec] = SCENARIOS[config.scenario].plan(config, random.Random(config.seed ^ 0x5EED))
        self._next_fault: FaultSpec | None = next(self._plan, None)
        self.node_names = config.node_names()
        self.gpn = config.gpus_per_node
        self.world = config.world_size
        self.gpus = [[Gpu(n, g, self.rng) for g in range(self.gpn)] for n in range(config.nodes)]
        self.modes = [NORMAL] * self.world
        self.generation = 0  # bumped when the job restarts: the launchers start fresh rank processes
        self.control_version = 0  # bumped whenever modes or generation change
        self.faults: list[FaultRecord] = []
        self.faults_version = 0
        self.pids: dict[int, int] = {}  # global rank -> real pid, when the runner knows it
        self.launcher_pids: dict[int, int] = {}
        self.step_history: list[tuple[int, float, float]] = []  # (step, end time, duration)
        self.tick = 0
        self._events: list[tuple[float, int, int, Callable[[], None]]] = []
        self._event_seq = 0
        self._epoch = 0  # a repair bumps it, cancelling the faulty timeline's pending events
        self._failed_order: list[int] = []
        self._torn_down: set[int] = set()
        self._out: list[LogLine] = []
        self.job = Job(step=10000 + self.rng.randrange(40000), seq=0)
        self.job.seq = self.job.step * COLLECTIVES_PER_STEP + 17
        self._plan_step()
        for n in range(config.nodes):
            boot = self.start - timedelta(hours=3 + self.rng.random() * 40)
            self._kern_at(n, boot, fmt.DRIVER_BANNER)
            self._kern_at(n, boot + timedelta(seconds=4), fmt.NVLINK_BANNER)
        self._sample()

    # --- public ---

    @property
    def t(self) -> float:
        return self.tick * TICK

    @property
    def next_fault(self) -> FaultSpec | None:
        """The next planned injection (where and when), not yet applied."""
        return self._next_fault

    def advance(self, t: float) -> list[LogLine]:
        """Run the model up to simulated time t; return the log lines written meanwhile."""
        while (self.tick + 1) * TICK <= t + 1e-9:
            self.tick += 1
            self._run_due()
            self._advance_job()
            self._sample()
            self._chatter()
        out, self._out = self._out, []
        return out

    def snapshot(self) -> dict[str, list[GpuSample]]:
        """Field values of every GPU still on the bus, per node (a lost GPU's series vanish)."""
        return {
            name: [GpuSample(g.index, g.uuid, g.bus_id, g.values) for g in self.gpus[n] if not g.lost]
            for n, name in enumerate(self.node_names)
        }

    def control_text(self, node: int) -> str:
        """What the node's launcher and rank processes read: the generation, then one mode per local rank."""
        lines = [f"generation {self.generation}"]
        lines += [f"{lr} {self.modes[node * self.gpn + lr]}" for lr in range(self.gpn)]
        return "\n".join(lines) + "\n"

    def set_pids(self, node: int, pids: dict[int, int]) -> None:
        for lr, pid in pids.items():
            self.pids[node * self.gpn + lr] = pid

    def ground_truth(self) -> dict[str, Any]:
        return {
            "scenario": self.config.scenario,
            "job_id": self.config.job_id,
            "nodes": self.node_names,
            "world_size": self.world,
            "gpus_per_node": self.gpn,
            "seed": self.config.seed,
            "started_at": self.start.isoformat(),
            "faults": [f.to_json() for f in self.faults],
        }

    # --- time and events ---

    def _ts(self, offset: float = 0.0) -> datetime:
        return self.start + timedelta(seconds=self.t + offset)

    def _schedule(self, delay: float, action: Callable[[], None]) -> None:
        self._event_seq += 1
        heapq.heappush(self._events, (self.t + delay, self._event_seq, self._epoch, action))

    def _run_due(self) -> None:
        now = self.t + 1e-9
        while self._next_fault is not None and self._next_fault.at <= now:
            spec, self._next_fault = self._next_fault, next(self._plan, None)
            self._inject(spec)
        while self._events and self._events[0][0] <= now:
            _, _, epoch, action = heapq.heappop(self._events)
            if epoch == self._epoch:
                action()

    # --- output helpers ---

    def _kern_at(self, node: int, ts: datetime, *messages: str) -> None:
        self._out.append(LogLine(self.node_names[node], "kern", fmt.kern(ts, *messages)))

    def _kern(self, node: int, *messages: str) -> None:
        self._kern_at(node, self._ts(), *messages)

    def _train(self, node: int, lines: list[str]) -> None:
        self._out.append(LogLine(self.node_names[node], "train", "\n".join(lines)))

    def _pid(self, rank: int) -> int:
        # Real pids once the runner reports them; stable made-up ones otherwise (pure model, tests).
        return self.pids.get(rank, 20000 + 37 * rank + (self.config.seed or 0) % 1000)

    def _launcher_pid(self, node: int) -> int:
        return self.launcher_pids.get(node, 19000 + 11 * node)

    def _rank(self, node: int, gpu: int) -> int:
        return node * self.gpn + gpu

    def _set_mode(self, rank: int, mode: str) -> None:
        if self.modes[rank] != mode:
            self.modes[rank] = mode
            self.control_version += 1
            if mode in DEAD and mode != TERMINATED:
                self._failed_order.append(rank)

    # --- the training job ---

    def _plan_step(self) -> None:
        job, base = self.job, self.config.step_seconds
        # A throttled GPU computes at its reduced clock; everyone else then waits for it in the all-reduce.
        slow = [THROTTLE_RATIO if self._gpu_of(r).thermal else 1.0 for r in range(self.world)]
        job.compute = [base * COMPUTE_SHARE * (1.0 + self.rng.gauss(0, 0.012)) / slow[r] for r in range(self.world)]
        job.compute_max = max(job.compute)
        job.duration = job.compute_max + base * (1 - COMPUTE_SHARE) * job.comm_factor * (1.0 + self.rng.gauss(0, 0.03))

    def _gpu_of(self, rank: int) -> Gpu:
        return self.gpus[rank // self.gpn][rank % self.gpn]

    def _advance_job(self) -> None:
        job = self.job
        if job.state != "running" or self.t < job.stall_until:
            return
        job.phase += TICK
        if job.phase >= job.duration - 1e-9:
            overshoot = max(0.0, job.phase - job.duration)
            self._complete_step(self.t - overshoot)  # the exact end, between two ticks
            job.phase = overshoot
            self._plan_step()

    def _complete_step(self, end: float) -> None:
        job, rng = self.job, self.rng
        job.step += 1
        job.seq += COLLECTIVES_PER_STEP
        took = end - job.started_at
        job.started_at = end
        self.step_history.append((job.step, end, took))
        x = job.step / 1000 + 1
        job.loss_drift = 0.9 * job.loss_drift + rng.gauss(0, 0.012)
        loss = 1.55 + 3.1 * x**-0.45 + job.loss_drift + rng.gauss(0, 0.02)
        grad_norm = (0.22 + 0.9 * x**-0.35) * math.exp(rng.gauss(0, 0.12)) * (3.0 if rng.random() < 0.01 else 1.0)
        if job.nan:
            loss = math.nan
            grad_norm = math.nan if rng.random() < 0.8 else math.inf
            job.nan_iters += 1
        lr = 1e-5 + (3e-4 - 1e-5) * 0.5 * (1 + math.cos(math.pi * job.step / TOTAL_ITERS))
        ts = self.start + timedelta(seconds=end)
        tflops = 395.0 * self.config.step_seconds / max(took, 1e-3) * (1 + rng.gauss(0, 0.004))
        last = self.config.nodes - 1
        for n in range(self.config.nodes):
            if n == last:  # Megatron logs from the last rank
                line = fmt.megatron_step(
                    ts, job.step, TOTAL_ITERS, job.step * GLOBAL_BATCH, took * 1000, tflops, lr, GLOBAL_BATCH,
                    loss, grad_norm, job.nan_iters,
                )  # fmt: skip
            else:
                line = fmt.simple_step(ts, n * self.gpn, job.step, loss, grad_norm, lr, took)
            self._train(n, [line])

    def _activity(self, rank: int) -> str:
        mode, job = self.modes[rank], self.job
        if mode == NORMAL:
            if job.state != "running":
                return NONE
            if self.t < job.stall_until:
                return SPIN
            if job.phase < job.compute[rank]:
                return COMPUTE
            return WAIT if job.phase < job.compute_max else COMM
        if mode == VICTIM:
            return SPIN
        if mode in (CULPRIT_DATA, CULPRIT_SYNC):
            return IDLE
        return NONE

    def _sample(self) -> None:
        nvlink_scale = 1.0 / self.job.comm_factor
        for n, gpus in enumerate(self.gpus):
            for g in gpus:
                if not g.lost:
                    g.update(self._activity(self._rank(n, g.index)), nvlink_scale, self.rng)

    def _chatter(self) -> None:
        # Mostly quiet kernel logs: a harmless line per node every few minutes.
        for n in range(self.config.nodes):
            if self.rng.random() < TICK / 300:
                self._kern(n, self.rng.choice(_BENIGN_KERNEL)(self.rng))

    # --- faults ---

    def _inject(self, spec: FaultSpec) -> None:
        kind = FAULT_KINDS[spec.kind]
        nodes, gpus, ranks = [], {}, []
        if spec.node is not None and spec.gpu is not None:
            name = self.node_names[spec.node]
            nodes, gpus, ranks = [name], {name: [spec.gpu]}, [self._rank(spec.node, spec.gpu)]
        record = FaultRecord(
            kind=spec.kind,
            nodes=nodes,
            gpus=gpus,
            ranks=ranks,
            injected_at=self._ts(),
            blame=kind.blame,
            expect_eviction=kind.expect_eviction,
            t=self.t,
        )
        self.faults.append(record)
        self.faults_version += 1
        getattr(self, f"_inject_{spec.kind}")(spec)
        if spec.repair_at is not None:
            delay = spec.repair_at - self.t
            self._schedule(delay, lambda: self._repair(record, spec))

    def _hang_job(self, culprits: dict[int, str], watchdog: float) -> None:
        """Ranks in `culprits` go their own way; every other live rank blocks in the next collective."""
        for r in range(self.world):
            if r in culprits:
                self._set_mode(r, culprits[r])
            elif self.modes[r] == NORMAL:
                self._set_mode(r, VICTIM)
        self.job.state = "hung"
        self._schedule(watchdog, lambda: self._watchdog_fires(watchdog))

    def _watchdog_fires(self, watchdog: float) -> None:
        victims = [r for r in range(self.world) if self.modes[r] == VICTIM]
        timeout_ms = int(watchdog * 1000)
        for n in range(self.config.nodes):
            lines: list[str] = []
            for r in (r for r in victims if r // self.gpn == n):
                ran_ms = timeout_ms + 20 + self.rng.randrange(60)
                ts = self._ts(0.001 * r + self.rng.random() * 0.0009)
                seq = self.job.seq + 1  # the collective that never completed
                lines += fmt.watchdog_timeout(r, ts, self._pid(r) + 60, seq, BUCKET_NUMEL, timeout_ms, ran_ms)
                self._set_mode(r, ABORT)
            if lines:
                self._train(n, lines)
        self._schedule(1.0, self._teardown_all)

    def _teardown_node(self, node: int) -> None:
        """torchrun on `node` saw a worker fail: SIGTERM to the rest, then the ChildFailedError summary."""
        if node in self._torn_down:
            return
        self._torn_down.add(node)
        local = range(node * self.gpn, (node + 1) * self.gpn)
        failed = [r for r in self._failed_order if r in local]
        survivors = [r for r in local if self.modes[r] not in DEAD]
        for r in survivors:
            self._set_mode(r, TERMINATED)
        if not failed:
            return
        failures = [(r, r % self.gpn, -6 if self.modes[r] == ABORT else 1, self._pid(r)) for r in failed]
        self._train(
            node,
            fmt.torchrun_failure(
                self._ts(), self._launcher_pid(node), self.node_names[node], failures, [self._pid(r) for r in survivors]
            ),
        )

    def _teardown_all(self) -> None:
        for n in range(self.config.nodes):
            self._teardown_node(n)
        self.job.state = "failed"

    def _inject_gpu_lost(self, spec: FaultSpec) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        # The link degrades first (AER corrected errors, PCIe replays), then the GPU drops off the bus.
        g.pcie_flaky = True
        self._kern(n, *fmt.aer_corrected(f"0000:{g.bus - 1:02x}:00.0"))

        def falls_off() -> None:
            g.lost, g.xid, g.pcie_flaky = True, 79, False
            self._kern(n, f"NVRM: GPU at {fmt.xid_bus(g.bus)}: {g.uuid}")
            self._kern(n, f"NVRM: GPU Board Serial Number: {g.serial}")
            self._kern(n, fmt.xid(g.bus, 79, "GPU has fallen off the bus."))
            self._kern(n, f"NVRM: GPU {fmt.pci_addr(g.bus)}: GPU has fallen off the bus.")
            self._kern(n, *fmt.fallen_off_bus(g.bus, F.PCI_DEVICE_ID))
            self._hang_job({self._rank(n, g.index): CULPRIT_SYNC}, self.config.watchdog_seconds)

        self._schedule(2.0, falls_off)

    def _inject_ecc_dbe(self, spec: FaultSpec) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        rank = self._rank(n, g.index)
        g.dbe_vol += 1
        g.dbe_agg += 1
        g.sbe_vol += self.rng.randrange(2, 9)
        g.sbe_agg += g.sbe_vol
        g.xid = 48
        partition, sub = self.rng.randrange(8), self.rng.randrange(2)
        self._kern(
            n,
            fmt.xid(
                g.bus,
                48,
                "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
                f"partition {partition}, subpartition {sub}.",
            ),
        )
        self._train(n, fmt.traceback_ecc(rank))
        self._set_mode(rank, CRASH_ECC)
        self._hang_job({}, self.config.watchdog_seconds)

        def remap() -> None:
            g.xid = 63
            g.unc_remap += 1
            row = self.rng.getrandbits(28)
            self._kern(
                n,
                fmt.xid(
                    g.bus, 63, f"Row Remapper: New row (0x{row:016x}) marked for remapping, reset gpu to activate.",
                    self._pid(rank), "pt_main_thread",
                ),
            )  # fmt: skip

        self._schedule(0.6, remap)
        self._schedule(1.0, lambda: self._teardown_node(n))

    def _inject_nvlink(self, spec: FaultSpec) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        g.nvlink_bad = True
        g.xid = 74
        self.job.comm_factor = NVLINK_COMM_FACTOR

        def xid74(remaining: int) -> None:
            link = self.rng.randrange(18)
            text = f"NVLink: fatal error detected on link {link}(0x0, 0x0, 0x0, 0x10000, 0x0, 0x0, 0x0)"
            self._kern(n, fmt.xid(g.bus, 74, text))
            if remaining > 0:
                self._schedule(15.0 + self.rng.random() * 15.0, lambda: xid74(remaining - 1))

        xid74(3)

    def _inject_ib_flap(self, spec: FaultSpec) -> None:
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        nic = f"0000:{F.PCI_BUSES[gpu % 8] - 1:02x}:00.0"
        port = f"ibp{F.PCI_BUSES[gpu % 8] - 1}s0"
        peer = (n + 1) % self.config.nodes if self.config.nodes > 1 else n

        def link(state: str) -> None:
            self._kern(n, f"mlx5_core {nic} {port}: Link {state}")

        def nccl_errors() -> None:
            pid = self._pid(rank)
            lines = fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Recv")
            lines += fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Send")
            self._train(n, lines)

        # First flap: errors, the job stalls a few seconds, the link comes back.
        link("down")
        nccl_errors()
        self.job.stall_until = self.t + IB_FLAP_STALL
        self._schedule(IB_FLAP_STALL, lambda: link("up"))

        def second_flap() -> None:
            link("down")
            nccl_errors()
            self._train(n, fmt.traceback_nccl_remote(rank, self.node_names[peer]))
            self._set_mode(rank, CRASH_NCCL)
            self._hang_job({}, self.config.watchdog_seconds)
            self._schedule(1.0, lambda: self._teardown_node(n))
            self._schedule(8.0, lambda: link("up"))

        self._schedule(IB_SECOND_FLAP, second_flap)

    def _inject_straggler(self, spec: FaultSpec) -> None:
        self.gpus[spec.node][spec.gpu].thermal = True  # type: ignore[index]
        self._plan_step()  # the step in flight is already slower

    def _inject_hang(self, spec: FaultSpec) -> None:
        assert spec.node is not None and spec.gpu is not None
        self._hang_job({self._rank(spec.node, spec.gpu): CULPRIT_DATA}, self.config.hang_watchdog_seconds)

    def _inject_user_bug(self, spec: FaultSpec) -> None:
        for n in range(self.config.nodes):
            lines: list[str] = []
            for r in range(n * self.gpn, (n + 1) * self.gpn):
                lines += fmt.traceback_user_bug(r)
                self._set_mode(r, CRASH_USER)
            self._train(n, lines)
        self.job.state = "failed"
        self._schedule(1.0, self._teardown_all)

    def _inject_nan_loss(self, spec: FaultSpec) -> None:
        self.job.nan = True

    def _repair(self, record: FaultRecord, spec: FaultSpec) -> None:
        """The node is fixed (or swapped) and the job restarted from its last checkpoint."""
        self._epoch += 1
        if spec.node is not None:
            for g in self.gpus[spec.node]:
                g.reset()
            self._kern(spec.node, fmt.DRIVER_BANNER)
        job = self.job
        job.comm_factor, job.stall_until, job.nan = 1.0, 0.0, False
        job.state, job.phase, job.started_at = "running", 0.0, self.t
        self.generation += 1
        self.control_version += 1
        for r in range(self.world):
            self.modes[r] = NORMAL
        self._failed_order.clear()
        self._torn_down.clear()
        for n in range(self.config.nodes):
            self._train(
                n,
                [
                    fmt.torchrun_restart(self._ts(), self._launcher_pid(n), self.generation, 100),
                    f"{self._ts():%Y-%m-%d %H:%M:%S},000 INFO train.py:141 rank={n * self.gpn} "
                    f"resuming from checkpoint at step={job.step}",
                ],
            )
        self._plan_step()
        record.repaired_at = self._ts()
        self.faults_version += 1


def _ip(node: int) -> str:
    return f"10.10.{node // 200}.{node % 200 + 11}"


_BENIGN_KERNEL: tuple[Callable[[random.Random], str], ...] = (
    lambda r: (
        f"perf: interrupt took too long ({2500 + r.randrange(400)} > 2500), lowering "
        f"kernel.perf_event_max_sample_rate to {79000 - r.randrange(20) * 250}"
    ),
    lambda r: "TCP: request_sock_TCP: Possible SYN flooding on port 29500. Sending cookies.  Check SNMP counters.",
    lambda r: f"hrtimer: interrupt took {20000 + r.randrange(90000)} ns",
    lambda r: (
        f"systemd-journald[{800 + r.randrange(300)}]: Data hash table of /var/log/journal/system.journal has "
        "a fill level at 75.0, suggesting rotation."
    ),
)
