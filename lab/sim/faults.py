"""Fault injection into the simulated cluster: each fault kind's kernel and training log lines, the hang or
crash it causes, the watchdog and torchrun teardown that follow, and the repair that restarts the job."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lab.sim import dcgm_fields as F
from lab.sim import logformat as fmt
from lab.sim.config import SimConfig
from lab.sim.fabric import Fabric
from lab.sim.gpu import COMPUTE_SHARE, Gpu
from lab.sim.host import Host
from lab.sim.modes import (
    ABORT,
    CHECKPOINT,
    CRASH_ECC,
    CRASH_NCCL,
    CRASH_USER,
    CULPRIT_CKPT,
    CULPRIT_DATA,
    CULPRIT_SYNC,
    DEAD,
    NORMAL,
    TERMINATED,
    VICTIM,
    VICTIM_BARRIER,
    VICTIMS,
)
from lab.sim.realism import CHECKPOINT_PAUSE, FORCED_CHECKPOINT_S
from lab.sim.scenarios import FAULT_KINDS, FLAP_OFF_S, FLAP_ON_S, FaultSpec

if TYPE_CHECKING:
    from lab.sim.model import Job

NVLINK_COMM_FACTOR = 1.8  # NVLink replays stretch the all-reduce
BUCKET_NUMEL = 126353408
IB_FLAP_STALL = 6.0  # seconds the first flap stalls the job
IB_SECOND_FLAP = 40.0  # the link drops again this long after the first flap, for good
IB_SECOND_FLAP_DOWN = 8.0
PORT_FLAPS = 3  # ib_port_flap: flaps within about a minute
PORT_FLAP_GAP = 23.0  # seconds between flaps (give or take a few)
PORT_ACTIVATION = 1.0  # seconds from link trained (INIT) to ACTIVE: the subnet manager's sweep
XID_INTO_CHECKPOINT_S = (3.0, 8.0)  # fault_in_checkpoint: the GPU drops off this far into the save
SOFTWARE_SLOW_WAIT = 0.3  # software_slow: of a step, what the node's ranks wait for their data
SOFTWARE_SLOW_CORES = 24  # cores the runaway loader worker's threads keep busy
TRANSIENT_VARIANTS = ("pcie_replay", "loader_stall", "nccl_retry")


def comm_factor_for(slowdown: float) -> float:
    """The all-reduce stretch that makes a whole step `slowdown` times longer (compute unchanged)."""
    return 1.0 + (slowdown - 1.0) / (1.0 - COMPUTE_SHARE)


IB_CONGESTION_COMM_FACTOR = comm_factor_for(1.30)
PCIE_DOWNGRADE_COMM_FACTOR = comm_factor_for(1.15)


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

    if TYPE_CHECKING:  # the cluster's, from RealLife (lab/sim/realism.py)

        def _node_ts(self, node: int, offset: float = 0.0) -> datetime: ...
        def _stop_pause(self) -> None: ...
        def _begin_checkpoint(self, seconds: float, stuck_rank: int | None = None) -> None: ...
        def _loader_stall(self, rank: int, seconds: float) -> None: ...
        def _rank(self, node: int, gpu: int) -> int: ...
        def machine_of(self, rank: int) -> int: ...
        def ranks_on(self, node: int) -> list[int]: ...
        def node_rank(self, node: int) -> int | None: ...
        def swap_out(self, machine: int, *, then: str) -> str: ...

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

    def _inject_gpu_lost(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        # The link degrades first (AER corrected errors, PCIe replays), then the GPU drops off the bus.
        g.pcie_flaky = True
        self._kern(n, *fmt.aer_corrected(f"0000:{g.bus - 1:02x}:00.0"))
        self._schedule(2.0, lambda: self._falls_off_bus(n, g))

    def _falls_off_bus(self, n: int, g: Gpu) -> None:
        """Xid 79: the GPU's series vanish, its rank blocks in a CUDA call, the others in the next collective."""
        g.lost, g.xid, g.pcie_flaky = True, 79, False
        self._kern(n, f"NVRM: GPU at {fmt.xid_bus(g.bus)}: {g.uuid}")
        self._kern(n, f"NVRM: GPU Board Serial Number: {g.serial}")
        self._kern(n, fmt.xid(g.bus, 79, "GPU has fallen off the bus."))
        self._kern(n, f"NVRM: GPU {fmt.pci_addr(g.bus)}: GPU has fallen off the bus.")
        self._kern(n, *fmt.fallen_off_bus(g.bus, F.PCI_DEVICE_ID))
        self._hang_job({self._rank(n, g.index): CULPRIT_SYNC}, self.config.watchdog_seconds)

    def _inject_gpu_reset(self, spec: FaultSpec, record: FaultRecord) -> None:
        """Xid 119: the GPU's GSP stops answering RPCs; the driver needs the GPU reset, the rest of the node is fine."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        rank = self._rank(n, g.index)
        g.xid = 119
        self._kern(
            n,
            fmt.xid(
                g.bus,
                119,
                "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
                "(0x20801348 0x404).",
                pid=self._pid(rank),
                name="python",
            ),
        )
        self._train(n, fmt.traceback_cuda(rank, "unspecified launch failure"))
        self._set_mode(rank, CRASH_ECC)  # the rank process exits with its CUDA error
        self._hang_job({}, self.config.watchdog_seconds)

    def _inject_ecc_dbe(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        g.sbe_vol += self.rng.randrange(2, 9)
        g.sbe_agg += g.sbe_vol
        self._framebuffer_dbe(n, g)
        self._crash_rank_ecc(n, g)

        def remap() -> None:
            g.xid = 63
            g.unc_remap += 1
            row = self.rng.getrandbits(28)
            self._row_remapper(
                n, g, 63, f"Row Remapper: New row (0x{row:016x}) marked for remapping, reset gpu to activate."
            )

        self._schedule(0.6, remap)

    def _framebuffer_dbe(self, n: int, g: Gpu) -> None:
        """Xid 48: an uncorrectable double-bit error in the GPU's memory, counted."""
        g.dbe_vol += 1
        g.dbe_agg += 1
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

    def _row_remapper(self, n: int, g: Gpu, code: int, text: str) -> None:
        """The row remapper's Xid (63: a row marked; 64: no spare row left), in the GPU's rank's context."""
        self._kern(n, fmt.xid(g.bus, code, text, self._pid(self._rank(n, g.index)), "pt_main_thread"))

    def _crash_rank_ecc(self, n: int, g: Gpu) -> None:
        """The GPU's rank dies with CUDA's uncorrectable-ECC error; its node's torchrun tears down, peers wait."""
        rank = self._rank(n, g.index)
        self._train(n, fmt.traceback_ecc(rank))
        self._set_mode(rank, CRASH_ECC)
        self._hang_job({}, self.config.watchdog_seconds)
        self._schedule(1.0, lambda: self._teardown_node(n))

    def _inject_hbm_remap_failure(self, spec: FaultSpec, record: FaultRecord) -> None:
        """HBM3: an uncorrectable error in a row (Xid 48), and the remapper has no spare row left in its bank
        (Xid 64, DCGM_FI_DEV_ROW_REMAP_FAILURE=1): a reset cannot fix it, the GPU needs repair."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        self._framebuffer_dbe(n, g)
        self._crash_rank_ecc(n, g)

        def remap_fails() -> None:
            g.xid, g.remap_failure = 64, 1
            row = self.rng.getrandbits(28)
            self._row_remapper(
                n, g, 64, f"Row Remapper Error: (0x{row:016x}) - All reserved rows for bank are remapped"
            )

        self._schedule(0.5, remap_fails)

    def _inject_sram_ecc(self, spec: FaultSpec, record: FaultRecord) -> None:
        """GPU SRAM: an uncorrectable ECC error in an SM's SRAM, contained to the process (Xid 94, H100's form):
        the rank dies with CUDA's ECC error; a reset of the GPU clears it."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        g.dbe_vol += 1  # the volatile total counts SRAM errors too
        g.dbe_agg += 1
        g.xid = 94
        unit = self.rng.choice(("SM (0x1)", "SM (0x2)", "LTC (0x1)"))
        self._kern(
            n,
            fmt.xid(g.bus, 94, f"Contained: {unit}. RST: Yes, D-RST: No", self._pid(self._rank(n, g.index)), "python"),
        )
        self._crash_rank_ecc(n, g)

    def _inject_gsp_error(self, spec: FaultSpec, record: FaultRecord) -> None:
        """GSP: the GPU System Processor's task times out (Xid 120); the rank dies, a GPU reset recovers it."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        rank = self._rank(n, g.index)
        g.xid = 120
        pc = 0x5D00000 + self.rng.randrange(0x100000)
        self._kern(n, fmt.xid(g.bus, 120, f"GSP task timeout @ pc:0x{pc:x}, task: 1", self._pid(rank), "python"))
        self._train(n, fmt.traceback_cuda(rank, "unspecified launch failure"))
        self._set_mode(rank, CRASH_ECC)
        self._hang_job({}, self.config.watchdog_seconds)

    def _inject_nic_down(self, spec: FaultSpec, record: FaultRecord) -> None:
        """NIC: the HCA of one GPU hits a firmware fatal error and its port stays down; the rank's NCCL
        connections fail (IB error 12), it dies, peers time out."""
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        nic, port = _hca(gpu)
        peer = self._peer(n)
        line, worker = 330 + self.rng.randrange(20), 900 + self.rng.randrange(99)
        self._kern(n, f"mlx5_core {nic}: poll_health:{800 + self.rng.randrange(60)}:(pid 0): Fatal error 1 detected")
        self._kern(n, f"mlx5_core {nic}: mlx5_health_try_recover:{line}:(pid {worker}): handling bad device here")
        self._kern(n, f"mlx5_core {nic} {port}: Link down")
        self._port_down(n, gpu)
        pid = self._pid(rank)
        lines = fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Send")
        self._train(n, lines + fmt.traceback_nccl_remote(rank, self.node_names[peer]))
        self._set_mode(rank, CRASH_NCCL)
        self._hang_job({}, self.config.watchdog_seconds)
        self._schedule(1.0, lambda: self._teardown_node(n))

    def _inject_sdc(self, spec: FaultSpec, record: FaultRecord) -> None:
        """Silent data corruption: one GPU computes wrong values with no error anywhere; the loss its node reports
        turns NaN or jumps on most steps, while the other nodes' stay ordinary."""
        self.gpus[spec.node][spec.gpu].corrupting = True  # type: ignore[index]

    def _inject_host_maintenance(self, spec: FaultSpec, record: FaultRecord) -> None:
        """Planned host maintenance: the operator drains the machine (a silence first, where a harness has a
        service), so the scheduler takes it out of the job and a spare takes its place, as for an eviction;
        nothing is wrong with it and nobody may accuse it."""
        from lab.sim.pool import REPAIR  # the pool imports this module

        assert spec.node is not None
        self.swap_out(spec.node, then=REPAIR)

    def _inject_nvlink(self, spec: FaultSpec, record: FaultRecord) -> None:
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

    def _inject_ib_flap(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        nic, port = _hca(gpu)
        peer = self._peer(n)

        def link(state: str) -> None:
            self._kern(n, f"mlx5_core {nic} {port}: Link {state}")

        def nccl_errors() -> None:
            pid = self._pid(rank)
            lines = fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Recv")
            lines += fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Send")
            self._train(n, lines)

        def down() -> None:
            link("down")
            self._port_down(n, gpu)

        def up() -> None:
            link("up")
            self._port_up(n, gpu)

        # First flap: errors, the job stalls a few seconds, the link comes back.
        down()
        nccl_errors()
        self.job.stall_until = self.t + IB_FLAP_STALL
        self._schedule(IB_FLAP_STALL, up)

        def second_flap() -> None:
            down()
            nccl_errors()
            self._train(n, fmt.traceback_nccl_remote(rank, self.node_names[peer]))
            self._set_mode(rank, CRASH_NCCL)
            self._hang_job({}, self.config.watchdog_seconds)
            self._schedule(1.0, lambda: self._teardown_node(n))
            self._schedule(IB_SECOND_FLAP_DOWN, up)

        self._schedule(IB_SECOND_FLAP, second_flap)

    def _peer(self, n: int) -> int:
        """The machine of the next node rank (the ring neighbour NCCL's IB lines name)."""
        slot = self.node_rank(n) or 0
        return self.slots[(slot + 1) % len(self.slots)] if len(self.slots) > 1 else n

    def _port_down(self, n: int, gpu: int) -> None:
        """The GPU's IB port loses its link (counters step, state DOWN, the PHY polling)."""
        self.fabrics[n].flap_down(gpu, self.rng)

    def _port_up(self, n: int, gpu: int) -> None:
        """The link trains again (INIT), then the subnet manager activates the port."""
        self.fabrics[n].link_trained(gpu)
        self._schedule(PORT_ACTIVATION, lambda: self.fabrics[n].port_active(gpu))

    def _port_flaps(self, spec: FaultSpec, nccl: bool) -> None:
        """PORT_FLAPS flaps of the GPU's port within about a minute; NCCL retries through each and the job goes on
        (it stalls while the link is down). With `nccl`, each flap also leaves NCCL's IB error lines."""
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        peer = self._peer(n)

        def flap() -> None:
            down_s = 3.0 + 2.0 * self.rng.random()
            self._port_down(n, gpu)
            self.job.stall_until = max(self.job.stall_until, self.t + down_s + PORT_ACTIVATION + 0.5)
            self._schedule(down_s, lambda: self._port_up(n, gpu))
            if nccl:
                pid = self._pid(rank)
                self._train(n, fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Recv"))

        flap()
        at = 0.0
        for _ in range(PORT_FLAPS - 1):
            at += PORT_FLAP_GAP + self.rng.uniform(-4.0, 4.0)
            self._schedule(at, flap)

    def _inject_ib_port_flap(self, spec: FaultSpec, record: FaultRecord) -> None:
        self._port_flaps(spec, nccl=False)

    def _inject_ib_port_flap_nccl(self, spec: FaultSpec, record: FaultRecord) -> None:
        self._port_flaps(spec, nccl=True)

    def _inject_ib_congestion(self, spec: FaultSpec, record: FaultRecord) -> None:
        assert spec.node is not None
        self.fabrics[spec.node].congest(80.0 + 50.0 * self.rng.random())
        self.job.comm_factor = IB_CONGESTION_COMM_FACTOR
        self._plan_step()

    def _inject_pcie_downgrade(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        # Trained at half width, or at Gen3 speed: a marginal riser, a reseated board, a bad retimer.
        g.pcie_gen, g.pcie_width = self.rng.choice(((F.PCIE_MAX_GEN, 8), (3, F.PCIE_MAX_WIDTH)))
        self.job.comm_factor = PCIE_DOWNGRADE_COMM_FACTOR
        self._plan_step()

    def _inject_host_mem_pressure(self, spec: FaultSpec, record: FaultRecord) -> None:
        assert spec.node is not None
        self.hosts[spec.node].start_memory_pressure(self.rng)

    def _inject_row_remap_pending(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        # Correctable errors in one row crossed the remap threshold: the row is recorded, the remap waits for
        # a GPU reset. No Xid line in this scenario: the counters are the only evidence.
        errors = self.rng.randint(3, 12)
        g.sbe_vol += errors
        g.sbe_agg += errors
        g.cor_remap += 1
        g.remap_pending = 1

    # Counter-only faults (issue 30): nothing in any log, no Xid; dcgm-exporter's counters are the evidence.
    def _inject_pcie_replay_climb(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.gpus[spec.node][spec.gpu].pcie_flaky = True  # type: ignore[index]  # replays climb, the GPU stays

    def _inject_nvlink_crc_climb(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.gpus[spec.node][spec.gpu].nvlink_bad = True  # type: ignore[index]  # CRC and replay counters climb
        self.job.comm_factor = NVLINK_COMM_FACTOR

    def _inject_row_remap_failure(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        g.unc_remap += 1  # an uncorrectable error's row remapped...

        def fail() -> None:  # ...then one the GPU has no spare row left for
            g.unc_remap += 1
            g.remap_failure = 1

        self._schedule(20.0 + self.rng.random() * 20.0, fail)

    def _inject_straggler(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.gpus[spec.node][spec.gpu].thermal = True  # type: ignore[index]
        self._plan_step()  # the step in flight is already slower

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

    # --- harder faults (issue 17) ---

    def _inject_fault_in_checkpoint(self, spec: FaultSpec, record: FaultRecord) -> None:
        """The job saves (its save interval came, or one is under way); a few seconds in, a GPU falls off the bus."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        if self.job.pause != CHECKPOINT_PAUSE:
            self._begin_checkpoint(self.rng.uniform(*FORCED_CHECKPOINT_S))
        into = self.rng.uniform(*XID_INTO_CHECKPOINT_S)
        self.job.pause_until = max(self.job.pause_until, self.t + into + 5.0)  # the save is still going then

        def falls() -> None:
            # The fault is the Xid: its time is when the GPU drops, not when the save began.
            record.injected_at, record.t = self._ts(), self.t
            self.faults_version += 1
            self._falls_off_bus(n, g)

        self._schedule(into, falls)

    def _inject_intermittent_straggler(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]

        def throttle(on: bool) -> None:
            g.thermal = on
            self._plan_step()
            self._schedule(FLAP_ON_S if on else FLAP_OFF_S, lambda: throttle(not on))

        throttle(True)

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


def _hca(gpu: int) -> tuple[str, str]:
    """The PCI address and port name of the GPU's own HCA (one NIC per GPU, on the bus before it)."""
    bus = F.PCI_BUSES[gpu % 8] - 1
    return f"0000:{bus:02x}:00.0", f"ibp{bus}s0"


def _ip(node: int) -> str:
    return f"10.10.{node // 200}.{node % 200 + 11}"
