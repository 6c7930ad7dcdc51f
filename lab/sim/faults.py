"""Fault injection into the simulated cluster: the injection of a planned fault, the course a fault sets off (the
hang, the watchdog and torchrun's teardown that follow), the repair that restarts the job; and the faults of the job
itself and of its host (a data hang, a user's bug, a NaN loss, a hang inside a checkpoint, a runaway data loader,
host memory pressure, a harmless one-off).

The faults of the GPUs are in lab/sim/gpu_faults.py, those of the network in lab/sim/network_faults.py, a planned
drain in lab/sim/pool.py: each a mixin on top of FaultInjection, all mixed into the cluster (lab/sim/model.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lab.sim import logformat as fmt
from lab.sim.config import SimConfig
from lab.sim.fabric import Fabric
from lab.sim.gpu import COMPUTE_SHARE, Gpu
from lab.sim.host import Host
from lab.sim.job import CHECKPOINT_PAUSE, Job
from lab.sim.modes import (
    ABORT,
    CHECKPOINT,
    CRASH_USER,
    CULPRIT_CKPT,
    CULPRIT_DATA,
    DEAD,
    NORMAL,
    TERMINATED,
    VICTIM,
    VICTIM_BARRIER,
    VICTIMS,
)
from lab.sim.realism import FORCED_CHECKPOINT_S
from lab.sim.scenarios import FAULT_KINDS, FaultSpec

BUCKET_NUMEL = 126353408
SOFTWARE_SLOW_WAIT = 0.3  # software_slow: of a step, what the node's ranks wait for their data
SOFTWARE_SLOW_CORES = 24  # cores the runaway loader worker's threads keep busy
TRANSIENT_VARIANTS = ("pcie_replay", "loader_stall", "nccl_retry")


def comm_factor_for(slowdown: float) -> float:
    """The all-reduce stretch that makes a whole step `slowdown` times longer (compute unchanged)."""
    return 1.0 + (slowdown - 1.0) / (1.0 - COMPUTE_SHARE)


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
    eviction_optional: bool = False
    repaired_at: datetime | None = None
    expect_action: str = ""  # evict | diagnose | none (FaultKind.action)
    details: dict[str, Any] | None = None  # what else the kind records (the transient's variant)
    machine: int | None = None  # the machine's index in the cluster (its name is in `nodes`)
    # The closed loop (lab/sim/actions.py): when the machine left the job, and what took it out (evict,
    # diagnose, reset_gpu); `repaired_at` is then when the repair shop (or the reset) fixed it.
    left_job_at: datetime | None = None
    resolved_by: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "ranks": self.ranks,
            "injected_at": self.injected_at.isoformat(),
            "blame": self.blame,
            "expect_eviction": self.expect_eviction,
            "eviction_optional": self.eviction_optional,
            "expect_action": self.expect_action,
        }
        if self.details:
            out.update(self.details)
        if self.repaired_at is not None:
            out["repaired_at"] = self.repaired_at.isoformat()
        if self.left_job_at is not None:
            out["left_job_at"] = self.left_job_at.isoformat()
        if self.resolved_by:
            out["resolved_by"] = self.resolved_by
        return out


class FaultInjection:
    """Cluster's faults (lab/sim/model.py mixes this in): the state below is the cluster's, and so are the
    time, event and output helpers these methods call (_ts, _schedule, _kern, _train, _pid, _set_mode, ...)."""

    config: SimConfig
    rng: random.Random
    node_names: list[str]
    gpn: int
    world: int
    gpus: list[list[Gpu]]
    hosts: list[Host]
    fabrics: list[Fabric]
    modes: list[str]
    job: Job
    slots: list[int]
    faults: list[FaultRecord]
    faults_version: int
    generation: int
    control_version: int
    t: float
    _epoch: int
    _failed_order: list[int]
    _torn_down: set[int]
    noise: list[dict[str, Any]]
    loader_wait: dict[int, float]

    if TYPE_CHECKING:  # the cluster's, from RealLife (lab/sim/realism.py) and SparePool (lab/sim/pool.py)

        def _node_ts(self, node: int, offset: float = 0.0) -> datetime: ...
        def _stop_pause(self) -> None: ...
        def _begin_checkpoint(self, seconds: float, stuck_rank: int | None = None) -> None: ...
        def _loader_stall(self, rank: int, seconds: float) -> None: ...
        def _rank(self, node: int, gpu: int) -> int: ...
        def machine_of(self, rank: int) -> int: ...
        def ranks_on(self, node: int) -> list[int]: ...
        def node_rank(self, node: int) -> int | None: ...
        def _later(self, delay: float, action: Callable[[], None]) -> None: ...

    def inject(self, spec: FaultSpec) -> FaultRecord:
        """Inject `spec` now (its `at` is ignored; its node is a node rank): for a harness that draws faults as it
        goes (the campaign)."""
        return self._inject(spec)

    def repair(self, record: FaultRecord) -> None:
        """Fixed in place by hand (a user's fixed code, an operator's repair) and the job restarted."""
        gpu = next(iter(record.gpus.values()), [None])[0] if record.gpus else None
        self._repair(record, FaultSpec(record.t, record.kind, record.machine, gpu))

    def _inject(self, spec: FaultSpec) -> FaultRecord:
        kind = FAULT_KINDS[spec.kind]
        if spec.node is not None:  # the plan names a node rank: the fault lands on the machine there now
            spec = replace(spec, node=self.slots[spec.node])
        nodes: list[str] = []
        gpus: dict[str, list[int]] = {}
        ranks: list[int] = []
        if spec.node is not None:
            name = self.node_names[spec.node]
            nodes = [name]
            if spec.gpu is not None:
                gpus, ranks = {name: [spec.gpu]}, [self._rank(spec.node, spec.gpu)]
            else:  # the node as a whole: all its ranks are affected
                ranks = [self._rank(spec.node, g) for g in range(self.gpn)]
        record = FaultRecord(
            kind=spec.kind,
            nodes=nodes,
            gpus=gpus,
            ranks=ranks,
            injected_at=self._ts(),
            blame=kind.blame,
            expect_eviction=kind.expect_eviction,
            eviction_optional=kind.eviction_optional,
            t=self.t,
            expect_action=kind.action,
            machine=spec.node,
        )
        getattr(self, f"_inject_{spec.kind}")(spec, record)
        if kind.noise:  # nothing to find: the ground truth keeps it apart from the faults
            self.noise.append(record.to_json())
        else:
            self.faults.append(record)
        self.faults_version += 1
        if spec.repair_at is not None:
            delay = spec.repair_at - self.t
            self._schedule(delay, lambda: self._repair(record, spec))
        return record

    def _restore_component(self, record: FaultRecord) -> None:
        """A shared component's repair (lab/sim/shared_faults.py overrides it); nothing for other faults."""

    def _hang_job(self, culprits: dict[int, str], watchdog: float) -> None:
        """Ranks in `culprits` go their own way; every other live rank blocks in the next collective (in a
        checkpoint, the barrier after the save)."""
        victim = VICTIM_BARRIER if self.job.pause == CHECKPOINT_PAUSE else VICTIM
        for r in range(self.world):
            if r in culprits:
                self._set_mode(r, culprits[r])
            elif self.modes[r] in (NORMAL, CHECKPOINT):
                self._set_mode(r, victim)
        self._stop_pause()
        self.job.stall_rank = None
        self.job.state = "hung"
        self._schedule(watchdog, lambda: self._watchdog_fires(watchdog))

    def _watchdog_fires(self, watchdog: float) -> None:
        victims = [r for r in range(self.world) if self.modes[r] in VICTIMS]
        timeout_ms = int(watchdog * 1000)
        for n in self.slots:
            lines: list[str] = []
            for r in (r for r in victims if self.machine_of(r) == n):
                ran_ms = timeout_ms + 20 + self.rng.randrange(60)
                ts = self._node_ts(n, 0.001 * r + self.rng.random() * 0.0009)
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
        local = self.ranks_on(node)
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
                self._node_ts(node),
                self._launcher_pid(node),
                self.node_names[node],
                failures,
                [self._pid(r) for r in survivors],
            ),
        )

    def _teardown_all(self) -> None:
        for n in list(self.slots):
            self._teardown_node(n)
        self.job.state = "failed"

    def _repair(self, record: FaultRecord, spec: FaultSpec) -> None:
        """The node is fixed (or swapped) and the job restarted from its last checkpoint."""
        if record.repaired_at is not None or record.left_job_at is not None:  # the closed loop was first
            return
        self._epoch += 1
        if spec.node is not None:
            for g in self.gpus[spec.node]:
                g.repair()
            self.hosts[spec.node].repair()
            self.fabrics[spec.node].repair()
            self._kern(spec.node, fmt.DRIVER_BANNER)
        if record.details and record.details.get("machines"):
            self._restore_component(record)  # a shared component's machines (lab/sim/shared_faults.py)
        job = self.job
        self._stop_pause()
        if spec.node is not None:
            self.loader_wait.pop(spec.node, None)
        job.comm_factor, job.stall_until, job.nan = 1.0, 0.0, False
        job.stuck_rank = job.stall_rank = None
        job.state, job.phase, job.started_at = "running", 0.0, self.t
        self.generation += 1
        self.control_version += 1
        for r in range(self.world):
            self.modes[r] = NORMAL
        self._failed_order.clear()
        self._torn_down.clear()
        for k, n in enumerate(self.slots):
            self._train(
                n,
                [
                    fmt.torchrun_restart(self._node_ts(n), self._launcher_pid(n), self.generation, 100),
                    fmt.resuming(self._node_ts(n), k * self.gpn, job.step),
                ],
            )
        self._plan_step()
        record.repaired_at = self._ts()
        self.faults_version += 1

    # --- the job's and the host's own faults ---

    def _inject_host_mem_pressure(self, spec: FaultSpec, record: FaultRecord) -> None:
        assert spec.node is not None
        self.hosts[spec.node].start_memory_pressure(self.rng)

    def _inject_hang(self, spec: FaultSpec, record: FaultRecord) -> None:
        assert spec.node is not None and spec.gpu is not None
        self._hang_job({self._rank(spec.node, spec.gpu): CULPRIT_DATA}, self.config.hang_watchdog_seconds)

    def _inject_user_bug(self, spec: FaultSpec, record: FaultRecord) -> None:
        for n in self.slots:
            lines: list[str] = []
            for r in self.ranks_on(n):
                lines += fmt.traceback_user_bug(r)
                self._set_mode(r, CRASH_USER)
            self._train(n, lines)
        self.job.state = "failed"
        self._schedule(1.0, self._teardown_all)

    def _inject_nan_loss(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.job.nan = True

    def _inject_hang_in_checkpoint(self, spec: FaultSpec, record: FaultRecord) -> None:
        """A checkpoint save starts and one rank's write never returns (a storage mount hung on its node)."""
        assert spec.node is not None and spec.gpu is not None
        rank = self._rank(spec.node, spec.gpu)
        if self.job.pause == CHECKPOINT_PAUSE:
            self.job.stuck_rank = rank
            self._set_mode(rank, CULPRIT_CKPT)
        else:
            self._begin_checkpoint(self.rng.uniform(*FORCED_CHECKPOINT_S), stuck_rank=rank)

    def _inject_software_slow(self, spec: FaultSpec, record: FaultRecord) -> None:
        """A data-loader worker spins on the node's CPUs; its ranks wait for batches, so everyone waits for them."""
        assert spec.node is not None
        self.hosts[spec.node].start_cpu_hog(SOFTWARE_SLOW_CORES, self.rng)
        self.loader_wait[spec.node] = SOFTWARE_SLOW_WAIT * self.config.step_seconds
        self._plan_step()

    def _inject_transient(self, spec: FaultSpec, record: FaultRecord) -> None:
        """One harmless one-off on a healthy node, which recovers by itself."""
        n = spec.node
        assert n is not None
        variant = self.rng.choice(TRANSIENT_VARIANTS)
        gpu = self.rng.randrange(self.gpn)
        record.details = {"variant": variant, "gpu": gpu}
        g = self.gpus[n][gpu]
        if variant == "pcie_replay":  # a burst of link-level replays the link corrects: one AER line
            g.pcie_replay += self.rng.randint(4, 16)
            self._kern(n, *fmt.aer_corrected(f"0000:{g.bus - 1:02x}:00.0"))
        elif variant == "loader_stall":
            self._loader_stall(self._rank(n, gpu), self.rng.uniform(2.0, 4.0))
        else:  # one IB async event NCCL warns about and goes on through
            pid = self._pid(self._rank(n, gpu))
            self._train(n, [fmt.nccl_async_event(self.node_names[n], pid, pid + 83, gpu, "GID table change")])
