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
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from lab.sim import logformat as fmt
from lab.sim.config import RealismParams, SimConfig
from lab.sim.fabric import Fabric
from lab.sim.faults import FaultRecord
from lab.sim.gpu import (
    BUSY,
    COMM,
    COMPUTE,
    COMPUTE_SHARE,
    IDLE,
    NONE,
    SAVE,
    SPIN,
    TARGETS,
    THROTTLE_RATIO,
    TICK,
    WAIT,
    Gpu,
    GpuSample,
)
from lab.sim.gpu_faults import GpuFaults
from lab.sim.host import Host
from lab.sim.job import Job
from lab.sim.modes import CHECKPOINT, CULPRITS, DEAD, NORMAL, TERMINATED, VICTIMS
from lab.sim.network_faults import NetworkFaults
from lab.sim.nvl72 import GPUS_PER_TRAY, Nvl72Domain
from lab.sim.nvl72_faults import Nvl72Faults
from lab.sim.pool import SparePool
from lab.sim.realism import AgentAction, RealLife, RealState
from lab.sim.scenarios import SCENARIOS, FaultSpec
from lab.sim.shared_faults import SharedFaults

COLLECTIVES_PER_STEP = 4  # NCCL SeqNum advances this much per step
NODE_TICKS = 10  # host and network counters advance once per simulated second
_COMM_NVLINK = TARGETS[COMM][7]  # NVLink rate of a GPU in the all-reduce: its NIC's busiest time too
GLOBAL_BATCH = 1024
TOTAL_ITERS = 500000
SDC_STEP_SHARE = 0.7  # silent data corruption: the share of steps whose loss comes out wrong on the node
VACANT_RETRY_S = 10.0  # a planned fault on a node rank waiting for a spare is tried again this much later


@dataclass(frozen=True)
class LogLine:
    node: str
    stream: str  # "kern" or "train"
    text: str  # may hold several lines (a multi-line kernel record, a traceback)


# All but RealLife build on FaultInjection.
class Cluster(SparePool, GpuFaults, NetworkFaults, Nvl72Faults, SharedFaults, RealLife):
    def __init__(self, config: SimConfig) -> None:
        config = config.resolved()
        if config.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {config.scenario!r}; known: {', '.join(SCENARIOS)}")
        assert config.start is not None and config.seed is not None
        scenario = SCENARIOS[config.scenario]
        if scenario.realism and not config.realism:
            config = replace(config, realism=True)
        if scenario.nvl72 and not config.nvl72:
            config = replace(config, nvl72=True)
        if config.nvl72 and config.gpus_per_node != GPUS_PER_TRAY:  # a GB200 compute tray holds 4 GPUs
            config = replace(config, gpus_per_node=GPUS_PER_TRAY)
        if config.realism and scenario.realism_overrides:  # where the config left a default, the scenario's value
            defaults, params = RealismParams(), config.realism_params
            mine = {k: v for k, v in scenario.realism_overrides if getattr(params, k) == getattr(defaults, k)}
            config = replace(config, realism_params=replace(params, **mine))
        self.config = config
        self.start: datetime = config.start
        self.rng = random.Random(config.seed)
        # The plan draws from its own stream, so adding noise to the physics never moves a fault; seeded by the
        # scenario too, so that one seed does not put every scenario's fault on the same node (issue 26).
        plan_rng = random.Random(f"plan:{config.scenario}:{config.seed}")
        self._plan: Iterator[FaultSpec] = SCENARIOS[config.scenario].plan(config, plan_rng)
        self._next_fault: FaultSpec | None = next(self._plan, None)
        self.node_names = config.node_names()  # every machine: the job's, then the spares
        self.machines = config.machines
        self.gpn = config.gpus_per_node
        self.world = config.world_size
        # Node rank -> machine: the job's nodes, which a swap (lab/sim/actions.py) changes.
        self.slots: list[int] = list(range(config.nodes))
        self._slot_of: dict[int, int] = {m: k for k, m in enumerate(self.slots)}
        self.gpus = [[Gpu(n, g, self.rng) for g in range(self.gpn)] for n in range(self.machines)]
        # Hosts and networks draw from their own stream too: they leave the GPUs' noise as it was.
        self.node_rng = random.Random(config.seed ^ 0x40DE)
        self.hosts = [Host(n, self.node_rng) for n in range(self.machines)]
        self.fabrics = [Fabric(n, self.node_rng) for n in range(self.machines)]
        # One NVL72 rack's NVLink domain over the machines, when the nodes are its compute trays.
        self.nvl72: Nvl72Domain | None = (
            Nvl72Domain(rack=_rack(config.node_prefix), trays=self.machines) if config.nvl72 else None
        )
        for h in self.hosts:
            h.btime = int(self.start.timestamp() - h.uptime)
        self._comm_sum = [[0.0] * self.gpn for _ in range(self.machines)]  # per GPU, over the current second
        self._busy_sum = [0] * self.machines  # rank-ticks with a busy GPU, over the current second
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
        self._init_pool()
        self._torn_down: set[int] = set()
        self._out: list[LogLine] = []
        self.noise: list[dict[str, Any]] = []  # one-offs on healthy nodes (the transient scenario)
        self.skew = [timedelta(0)] * self.machines  # each node's clock offset (realism)
        self.agent_actions: list[AgentAction] = []
        self.loader_wait: dict[int, float] = {}  # machine -> seconds its ranks wait for data each step
        self.job = Job(step=10000 + self.rng.randrange(40000), seq=0)
        self.job.seq = self.job.step * COLLECTIVES_PER_STEP + 17
        self.real: RealState | None = None
        if config.realism:
            self.real = self._start_realism(config.realism_params)
            self._fresh_job()
        self.job.last_checkpoint = self.job.step
        self._plan_step()
        for n in range(self.machines):
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
            self._tick_pauses()
            if self.real is not None:
                self._realism_tick()
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
        """What the machine's launcher and rank processes read: the generation, the machine's node rank (`-` outside
        the job), then one mode per local rank."""
        slot = self.node_rank(node)
        lines = [f"generation {self.generation}", f"node_rank {'-' if slot is None else slot}"]
        lines += [f"{r % self.gpn} {self.modes[r]}" for r in self.ranks_on(node)]
        return "\n".join(lines) + "\n"

    def set_pids(self, node: int, pids: dict[int, int]) -> None:
        """The real pids of a machine's ranks, by local rank (ignored for a machine outside the job)."""
        ranks = self.ranks_on(node)
        for lr, pid in pids.items():
            if lr < len(ranks):
                self.pids[ranks[lr]] = pid

    def node_rank(self, node: int) -> int | None:
        """The machine's node rank in the job (torchrun's GROUP_RANK), None outside it."""
        return self._slot_of.get(node)

    def ranks_on(self, node: int) -> list[int]:
        """The global ranks running on a machine, by local rank; empty for a machine outside the job."""
        slot = self._slot_of.get(node)
        return [] if slot is None else list(range(slot * self.gpn, (slot + 1) * self.gpn))

    def machine_of(self, rank: int) -> int:
        return self.slots[rank // self.gpn]

    def rank_map(self) -> list[dict[str, Any]]:
        """Where each rank runs now, as job registration takes it (POST /api/v1/jobs `ranks`)."""
        return [
            {"rank": r, "node": self.node_names[self.machine_of(r)], "local_rank": r % self.gpn, "gpu": r % self.gpn}
            for r in range(self.world)
        ]

    def ground_truth(self) -> dict[str, Any]:
        out = {
            "scenario": self.config.scenario,
            "job_id": self.config.job_id,
            "nodes": self.node_names,
            "world_size": self.world,
            "gpus_per_node": self.gpn,
            "seed": self.config.seed,
            "started_at": self.start.isoformat(),
            "faults": [f.to_json() for f in self.faults],
        }
        if self.real is not None or self.noise:
            out["noise"] = self.noise
        if self.real is not None:
            out["realism"] = self.realism_truth()
        if self.machines > len(self.slots) or self.loop_events:
            out["spares"] = self.node_names[len(self.slots) :]
            out["job_nodes"] = [self.node_names[m] for m in self.slots]
            out["loop"] = [e.to_json() for e in self.loop_events]
        # Where each machine is now (the job, a spare, repair, a check, cordoned): what the service's node states
        # are compared with. `t`: the simulated second this was written at.
        out["t"] = round(self.t, 1)
        out["machines"] = self.places()
        return out

    # --- time and events ---

    def _ts(self, offset: float = 0.0) -> datetime:
        return self.start + timedelta(seconds=self.t + offset)

    def _schedule(self, delay: float, action: Callable[[], None]) -> None:
        self._event_seq += 1
        heapq.heappush(self._events, (self.t + delay, self._event_seq, self._epoch, action))

    def _run_due(self) -> None:
        now = self.t + 1e-9
        while self._next_fault is not None and self._next_fault.at <= now:
            spec = self._next_fault
            if spec.node is not None and spec.node in self.vacant:
                # Its node rank waits for a spare (the demo's loop evicted a machine and the pool is empty): the
                # fault lands on the machine that fills it, a little later.
                later = now + VACANT_RETRY_S
                repair_at = spec.repair_at + (later - spec.at) if spec.repair_at is not None else None
                self._next_fault = replace(spec, at=later, repair_at=repair_at)
                break
            self._next_fault = next(self._plan, None)
            self._inject(spec)
        while self._events and self._events[0][0] <= now:
            _, _, epoch, action = heapq.heappop(self._events)
            if epoch in (self._epoch, -1):  # -1: the closed loop's machine moves, never cancelled
                action()

    # --- output helpers ---

    def _kern_at(self, node: int, ts: datetime, *messages: str) -> None:
        ts += self.skew[node]  # the node's own clock
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
        return self._slot_of[node] * self.gpn + gpu

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
        # A node short of host memory computes slower too (its loaders page in and out).
        slow = [
            (THROTTLE_RATIO if self._gpu_of(r).thermal else 1.0) / self.hosts[self.machine_of(r)].slowdown
            for r in range(self.world)
        ]
        if self.real is not None:  # machines a few percent apart, within normal variation
            slow = [s * self.real.speed[self.machine_of(r)] for r, s in enumerate(slow)]
        job.compute = [base * COMPUTE_SHARE * (1.0 + self.rng.gauss(0, 0.012)) / slow[r] for r in range(self.world)]
        if self.loader_wait:  # ranks waiting on their data first: their GPU idles, then computes
            job.compute = [c + self.loader_wait.get(self.machine_of(r), 0.0) for r, c in enumerate(job.compute)]
        job.compute_max = max(job.compute)
        job.duration = job.compute_max + base * (1 - COMPUTE_SHARE) * job.comm_factor * (1.0 + self.rng.gauss(0, 0.03))

    def _gpu_of(self, rank: int) -> Gpu:
        return self.gpus[self.machine_of(rank)][rank % self.gpn]

    def _advance_job(self) -> None:
        job = self.job
        if job.state != "running" or self.t < job.stall_until or job.pause:
            return
        job.phase += TICK
        if job.phase >= job.duration - 1e-9:
            overshoot = max(0.0, job.phase - job.duration)
            self._complete_step(self.t - overshoot)  # the exact end, between two ticks
            job.phase = overshoot
            self._plan_step()
            if self.real is not None:
                self._after_step()

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
        lr = 1e-5 + (3e-4 - 1e-5) * 0.5 * (1 + math.cos(math.pi * job.step / TOTAL_ITERS))
        if self.real is not None:
            lr = self._learning_rate(job.step, lr)
            loss, grad_norm = self._spiked(loss, grad_norm)
        ts = self.start + timedelta(seconds=end)
        tflops = 395.0 * self.config.step_seconds / max(took, 1e-3) * (1 + rng.gauss(0, 0.004))
        last = self.slots[-1]
        for k, n in enumerate(self.slots):
            node_ts = ts + self.skew[n]
            node_loss = loss
            # Silent data corruption: wrong values on the node, no error anywhere.
            if any(g.corrupting for g in self.gpus[n]) and rng.random() < SDC_STEP_SHARE:
                node_loss = math.nan if rng.random() < 0.5 else loss * rng.uniform(6.0, 30.0)
            if n == last:  # Megatron logs from the last rank
                line = fmt.megatron_step(
                    node_ts, job.step, TOTAL_ITERS, job.step * GLOBAL_BATCH, took * 1000, tflops, lr, GLOBAL_BATCH,
                    node_loss, grad_norm, int(job.nan),  # Megatron counts NaN steps per logging interval
                )  # fmt: skip
            else:
                line = fmt.simple_step(node_ts, k * self.gpn, job.step, node_loss, grad_norm, lr, took)
            self._train(n, [line])

    def activity(self, rank: int) -> str:
        """What a rank is doing now (its GPU's activity, and where a stack dump would find it)."""
        return self._activity(rank)

    def _activity(self, rank: int) -> str:
        mode, job = self.modes[rank], self.job
        if mode == NORMAL:
            if job.state != "running":
                return NONE
            if job.pause:
                return self._pause_activity()
            if self.t < job.stall_until:
                return SPIN
            if self.loader_wait and job.phase < self.loader_wait.get(self.machine_of(rank), 0.0):
                return IDLE
            if job.phase < job.compute[rank]:
                return COMPUTE
            return WAIT if job.phase < job.compute_max else COMM
        if mode in VICTIMS:
            return SPIN
        if mode in CULPRITS:
            return IDLE
        return SAVE if mode == CHECKPOINT else NONE

    def _sample(self) -> None:
        nvlink_scale = 1.0 / self.job.comm_factor
        for n, gpus in enumerate(self.gpus):
            comm = self._comm_sum[n]
            for g in gpus:
                if not g.lost:
                    activity = self._activity(self._rank(n, g.index)) if n in self._slot_of else NONE
                    g.update(activity, nvlink_scale, self.rng)
                    comm[g.index] += g.act[7] * nvlink_scale
                    if activity in BUSY:
                        self._busy_sum[n] += 1
        if self.tick % NODE_TICKS == 0:
            self._node_second()
            self._sample_nodes(NODE_TICKS * TICK)

    def _sample_nodes(self, dt: float) -> None:
        """Advance every host and network by `dt`: traffic follows each GPU's all-reduce, CPU its ranks."""
        ticks = NODE_TICKS
        for n in range(self.machines):
            comm = [min(1.0, c / ticks / _COMM_NVLINK) for c in self._comm_sum[n]]
            self.fabrics[n].step(dt, comm, self.node_rng)
            self.hosts[n].step(dt, self._busy_sum[n] / (ticks * self.gpn), self.node_rng)
            self._comm_sum[n] = [0.0] * self.gpn
            self._busy_sum[n] = 0

    def _chatter(self) -> None:
        # Mostly quiet kernel logs: a harmless line per node every few minutes.
        for n in range(self.machines):
            if self.rng.random() < TICK / 300:
                self._kern(n, self.rng.choice(_BENIGN_KERNEL)(self.rng))


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


def _rack(node_prefix: str) -> str:
    """The NVL72 rack's name from its trays' prefix: `nvl72-a-tray` -> `nvl72-a`."""
    return node_prefix.removesuffix("tray").rstrip("-") or "nvl72"
