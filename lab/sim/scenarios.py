"""Scenarios: what goes wrong, where and when (the plan), and the ground truth each fault carries.

How a fault acts on the cluster lives in the model (`Cluster._inject_<kind>`); here only the plan.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lab.sim.config import SimConfig

GPU, NODE, JOB = "gpu", "node", "job"
EVICT, DIAGNOSE, NO_ACTION = "evict", "diagnose", "none"
CORDON_DOMAIN = "cordon"  # a shared component's fault: its nodes cordoned from new work, none evicted
# two_faults: the fatal Xid comes this long after the straggler started, time enough for the straggler to be
# told by peer comparison (its continuity window is ~2 minutes) before the job dies.
TWO_FAULTS_GAP_S = 180.0
# intermittent_straggler: the GPU throttles this long, then runs normally this long, over and over.
FLAP_ON_S, FLAP_OFF_S = 30.0, 90.0


@dataclass(frozen=True)
class FaultKind:
    name: str
    description: str
    blame: str  # "infrastructure" | "user_code" | "unknown"
    expect_eviction: bool
    scope: str  # GPU: a faulty node and GPU; NODE: a faulty node as a whole; JOB: no faulty machine
    # Evicting the faulty node is acceptable but not required (the evidence points at it, not at hardware).
    eviction_optional: bool = False
    # What the service should do: EVICT, DIAGNOSE (name the node, keep it) or NO_ACTION; "" derives it from
    # expect_eviction (evict) and eviction_optional (diagnose).
    expect_action: str = ""
    # A one-off on a healthy node: recorded as noise in the ground truth, not as a fault (nothing to find).
    noise: bool = False

    @property
    def on_gpu(self) -> bool:
        return self.scope == GPU

    @property
    def action(self) -> str:
        if self.expect_action:
            return self.expect_action
        return EVICT if self.expect_eviction else DIAGNOSE if self.eviction_optional else NO_ACTION


FAULT_KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind(
            "gpu_lost",
            "a GPU falls off the bus (Xid 79): its series vanish, its rank hangs, peers hit the watchdog",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "ecc_dbe",
            "uncorrectable ECC error (Xid 48, then 63): DBE counters rise, the rank dies with a CUDA error",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "gpu_reset",
            "a GSP RPC timeout on one GPU (Xid 119, which a GPU reset clears): its rank dies with a CUDA error; "
            "reset that GPU, keep the node",
            "infrastructure",
            False,
            GPU,
            eviction_optional=True,  # where GPU resets are off (or that GPU was reset lately) the node goes
            expect_action="reset_gpu",
        ),
        FaultKind(
            "nvlink",
            "NVLink errors (Xid 74) and rising CRC/replay counters on one GPU; the whole job slows",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "ib_flap",
            "an InfiniBand link flaps twice: NCCL IB error 12 on the node, then its rank fails and peers time out",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "straggler",
            "one GPU throttles (thermal): low SM clock and power, hot; every step ~40% slower; no error line",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "hang",
            "one rank stuck in its data loader, all others wait in all_reduce; silent until the (long) watchdog",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "user_bug",
            "the same RuntimeError traceback on every rank, then torchrun's ChildFailedError; no faulty node",
            "user_code",
            False,
            JOB,
        ),
        FaultKind(
            "nan_loss",
            "loss and grad norm become nan from the injection on; training goes on; no faulty node",
            "user_code",
            False,
            JOB,
        ),
        FaultKind(
            "ib_port_flap",
            "the IB port of one GPU flaps 3 times in a minute (link_downed, symbol errors); the job stalls a few "
            "seconds each time and goes on; no log line at all",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "ib_port_flap_nccl",
            "the same 3 IB port flaps, each with NCCL IB error 12 lines on the node; the job goes on after each",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "ib_congestion",
            "one node's IB ports congested: port_xmit_wait ~100x its peers', PFC pause frames and CNPs up; the "
            "whole job ~30% slower; no error line",
            "infrastructure",
            True,
            NODE,
        ),
        FaultKind(
            "pcie_downgrade",
            "one GPU's PCIe link trained at x8 or Gen3 instead of Gen5 x16: its PCIe throughput capped, the job "
            "~15% slower; no error line",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "host_mem_pressure",
            "one node's host memory nearly exhausted: MemAvailable ~2%, swapping, PSI memory and io stalls up; its "
            "ranks slow the job ~20%; no error line; evicting the node is optional",
            "unknown",
            False,
            NODE,
            eviction_optional=True,
        ),
        FaultKind(
            "row_remap_pending",
            "one GPU reports a pending row remap (DCGM_FI_DEV_ROW_REMAP_PENDING=1, a correctable remapped row) with "
            "no Xid line; the job trains on normally",
            "infrastructure",
            True,
            GPU,
        ),
        # Harder faults (issue 17).
        FaultKind(
            "fault_in_checkpoint",
            "a GPU falls off the bus (Xid 79) while the job is saving a checkpoint (every rank paused, storage "
            "busy); its rank never finishes the save, the others wait in the barrier until the watchdog",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "intermittent_straggler",
            f"one GPU throttles (thermal) {FLAP_ON_S:.0f} s on, {FLAP_OFF_S:.0f} s off, over and over: every step "
            "~40% slower while it does; no error line",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "hang_in_checkpoint",
            "one rank hangs inside the checkpoint save (its stack in save_checkpoint, stuck writing to storage); "
            "the others finish saving and wait in the barrier; silent until the (long) watchdog",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "software_slow",
            "a runaway data-loader worker burns one node's CPUs: its GPUs wait on data every step, the job ~25% "
            "slower, host CPU and load up; a software cause: diagnose the node, do not evict it",
            "user_code",
            False,
            NODE,
            expect_action=DIAGNOSE,
        ),
        FaultKind(
            "transient",
            "one healthy node shows a one-off that recovers (a burst of PCIe replays with an AER line, a short "
            "data-loader stall, or one NCCL WARN that NCCL retries through): nothing to evict or diagnose",
            "none",
            False,
            NODE,
            expect_action=NO_ACTION,
            noise=True,
        ),
        # The Llama 3 405B mix's kinds the others did not cover (issue 26: `faultline eval --campaign`).
        FaultKind(
            "hbm_remap_failure",
            "HBM3: an uncorrectable row (Xid 48), then the row remapper has no spare row left (Xid 64, "
            "ROW_REMAP_FAILURE=1); the rank dies with a CUDA ECC error; a reset cannot fix it: evict",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "sram_ecc",
            "GPU SRAM: an uncorrectable ECC error in an SM's SRAM, contained (Xid 94), the DBE count up; the rank "
            "dies with a CUDA ECC error; a reset of that GPU clears it",
            "infrastructure",
            False,
            GPU,
            eviction_optional=True,
            expect_action="reset_gpu",
        ),
        FaultKind(
            "gsp_error",
            "GPU System Processor: a GSP task timeout (Xid 120); the rank dies with a CUDA error; reset that GPU, "
            "keep the node",
            "infrastructure",
            False,
            GPU,
            eviction_optional=True,
            expect_action="reset_gpu",
        ),
        FaultKind(
            "nic_down",
            "NIC: one GPU's HCA hits a firmware fatal error (mlx5 poll_health) and its port stays down; NCCL IB "
            "error 12, the rank dies, peers time out",
            "infrastructure",
            True,
            GPU,
        ),
        FaultKind(
            "sdc",
            "silent data corruption: no error anywhere; one GPU computes wrong values, its node reports a NaN or a "
            "6-30x loss on most steps while the other nodes' stay ordinary; diagnose the node",
            "infrastructure",
            False,
            GPU,
            eviction_optional=True,
        ),
        FaultKind(
            "host_maintenance",
            "planned host maintenance: the operator silences a node and the scheduler drains it (the job stops "
            "with SIGTERM and restarts without it); nothing is wrong: nobody may be accused",
            "none",
            False,
            NODE,
            expect_action=NO_ACTION,
        ),
    )
}

# Counter-only faults (issue 30): the sim's metric-only family runs them with agents that read dcgm-exporter alone.
_COUNTER_KINDS = (
    FaultKind(
        "pcie_replay_climb",
        "one GPU's PCIe replay counter climbs ~30/s (a marginal link or riser); no log line, no Xid; diagnose",
        "infrastructure",
        False,
        GPU,
        eviction_optional=True,
        expect_action=DIAGNOSE,
    ),
    FaultKind(
        "nvlink_crc_climb",
        "one GPU's NVLink CRC flit/data and replay counters climb; the job slows; no log line, no Xid",
        "infrastructure",
        True,
        GPU,
    ),
    FaultKind(
        "row_remap_failure",
        "one GPU remaps a row after an uncorrectable error, then 20-40 s later has no spare row left "
        "(DCGM_FI_DEV_ROW_REMAP_FAILURE=1); no log line, no Xid",
        "infrastructure",
        True,
        GPU,
    ),
)
FAULT_KINDS.update((k.name, k) for k in _COUNTER_KINDS)
# NVLink domain faults (issue 43): on an NVL72 rack (SimConfig.nvl72, lab/sim/nvl72.py, lab/sim/nvl72_faults.py).
_NVL72_KINDS = (
    FaultKind(
        "nvswitch_tray_failure",
        "NVL72: one of the rack's 9 NVSwitch trays fails; every compute tray's GPUs lose 2 links (fatal NVLink5 "
        "Xid 149), their fabric degraded; the domain's fault: cordon its trays (one domain incident), evict none",
        "infrastructure",
        False,
        JOB,
        expect_action=CORDON_DOMAIN,
    ),
    FaultKind(
        "nvl72_tray_nvlink",
        "NVL72: one GPU's own NVLink links fail (fatal NVLink5 Xid 149 on that GPU only, its fabric unhealthy); "
        "that tray's fault: evict it, leave the domain's other trays alone",
        "infrastructure",
        True,
        GPU,
    ),
)
FAULT_KINDS.update((k.name, k) for k in _NVL72_KINDS)
NVL72_FAULT_KINDS = tuple(k.name for k in _NVL72_KINDS)
COUNTER_FAULT_KINDS = tuple(k.name for k in _COUNTER_KINDS)
# Shared-component faults (issue 42): a component several machines share fails (lab/sim/shared_faults.py). The
# component is to blame, not the machines: one shared incident, its machines cordoned from new work, none evicted.
_SHARED_KINDS = (
    FaultKind(
        "switch_down",
        "a leaf switch fails: every IB port of the job's machines behind it goes down at once, each rank's NCCL "
        "fails with IB error 12, the job dies; the switch's fault: cordon its machines, evict none",
        "infrastructure",
        False,
        JOB,
        expect_action=CORDON_DOMAIN,
    ),
    FaultKind(
        "driver_rollout",
        "a bad driver rollout reaches the job's machines: every GPU on the new version throws Xid 119 (GSP RPC "
        "timeout), every rank dies; the driver's fault: cordon its machines, evict none",
        "infrastructure",
        False,
        JOB,
        expect_action=CORDON_DOMAIN,
    ),
    FaultKind(
        "storage_outage",
        "the dataset's file system stops answering: every rank's data loader fails with EIO, the job dies; the "
        "storage's fault: cordon the machines that mount it, evict none",
        "infrastructure",
        False,
        JOB,
        expect_action=CORDON_DOMAIN,
    ),
    FaultKind(
        "rack_power_loss",
        "a rack's power feed drops: every GPU of its machines in the job falls off the bus at once (Xid 79), the "
        "job dies; the power domain's fault: cordon its machines, evict none",
        "infrastructure",
        False,
        JOB,
        expect_action=CORDON_DOMAIN,
    ),
)
FAULT_KINDS.update((k.name, k) for k in _SHARED_KINDS)
SHARED_FAULT_KINDS = tuple(k.name for k in _SHARED_KINDS)

# What `demo` draws from: faults that have a machine to blame.
HARDWARE_FAULTS = ("gpu_lost", "ecc_dbe", "nvlink", "ib_flap", "straggler")


@dataclass(frozen=True)
class FaultSpec:
    """One planned injection. Times are simulated seconds since the start."""

    at: float
    kind: str
    node: int | None = None
    gpu: int | None = None  # None for a fault of the node as a whole
    repair_at: float | None = None


Plan = Callable[[SimConfig, random.Random], Iterator[FaultSpec]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    plan: Plan
    # Real-life healthy noise on, whatever the config says (the fault is defined by it, or it is the point)...
    realism: bool = False
    # ...with these RealismParams fields set (denser noise, so a short run sees every kind of it).
    realism_overrides: tuple[tuple[str, object], ...] = ()
    # The agents read dcgm-exporter only (no kernel log, no training log, no processes) and the job is known by
    # its registered rank map: a node with nothing but dcgm-exporter (issue 30).
    metrics_only: bool = False
    # The cluster is one GB200 NVL72 rack's compute trays (4 GPUs each) in one NVLink domain (lab/sim/nvl72.py).
    nvl72: bool = False


def _nothing(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
    return iter(())


def _one(kind: str) -> Plan:
    def plan(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
        scope = FAULT_KINDS[kind].scope
        node = rng.randrange(config.nodes)  # drawn either way: a fault_node leaves the GPU's draw as it was
        if config.fault_node is not None:
            node = config.fault_node
        if scope == GPU:
            yield FaultSpec(config.fault_after, kind, node, rng.randrange(config.gpus_per_node))
        elif scope == NODE:
            yield FaultSpec(config.fault_after, kind, node)
        else:
            yield FaultSpec(config.fault_after, kind)

    return plan


def _demo(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
    # Healthy until fault_after, then a fault every fault_every seconds; each one is repaired (node fixed, job
    # restarted) after two thirds of the period, so the next one starts from a healthy cluster.
    at = config.fault_after
    hold = max(config.fault_every * 2 / 3, min(config.fault_every - 1.0, config.watchdog_seconds + 10.0))
    if config.spares:  # a closed loop: eviction is the repair; the scenario's own only just before the next fault
        hold = max(1.0, config.fault_every - 1.0)
    bag: list[str] = []
    last = None
    # A bounded run (`faultline demo --duration`) injects no fault it would end before seeing through: the 30-min
    # demo's last straggler, 2 minutes before the end, was still open in its summary.
    while config.duration is None or at + config.fault_every <= config.duration:
        if not bag:  # every kind once per round, in random order, never the same twice in a row
            bag = list(HARDWARE_FAULTS)
            rng.shuffle(bag)
            if bag[-1] == last:
                bag[0], bag[-1] = bag[-1], bag[0]
        kind = last = bag.pop()
        node, gpu = rng.randrange(config.nodes), rng.randrange(config.gpus_per_node)
        yield FaultSpec(at, kind, node, gpu if FAULT_KINDS[kind].scope == GPU else None, repair_at=at + hold)
        at += config.fault_every


def _two_faults(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
    # A straggler first, then a fatal Xid on another node of the same job once the straggler has had its time.
    gpus = config.gpus_per_node
    slow = rng.randrange(config.nodes)
    lost = (slow + 1 + rng.randrange(config.nodes - 1)) % config.nodes if config.nodes > 1 else slow
    yield FaultSpec(config.fault_after, "straggler", slow, rng.randrange(gpus))
    yield FaultSpec(config.fault_after + TWO_FAULTS_GAP_S, "gpu_lost", lost, rng.randrange(gpus))


# healthy_real's noise: an eval run watches a healthy cluster ~3 minutes, so every kind of noise comes sooner.
DENSE_NOISE: tuple[tuple[str, object], ...] = (
    ("checkpoint_every_s", 100.0),
    ("eval_every_s", 130.0),
    ("restart_every_s", 240.0),
    ("first_restart_s", 120.0),
    ("loader_stall_every_s", 60.0),
    ("loss_spike_every_s", 90.0),
    ("agent_restart_every_s", 240.0),
    ("day_s", 1800.0),
)
_REALISTIC_KINDS = frozenset({"fault_in_checkpoint"})

SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario("healthy", "nothing happens: a synchronous job training normally", _nothing),
    **{
        k: Scenario(k, FAULT_KINDS[k].description, _one(k), realism=k in _REALISTIC_KINDS, nvl72=k in NVL72_FAULT_KINDS)
        for k in FAULT_KINDS
    },
    "two_faults": Scenario(
        "two_faults",
        f"two faults in one job: a straggler GPU on one node, then {TWO_FAULTS_GAP_S:.0f} s later a GPU falls off "
        "the bus (Xid 79) on another; both nodes to be evicted",
        _two_faults,
    ),
    "healthy_real": Scenario(
        "healthy_real",
        "healthy with real-life noise: checkpoints, evaluations, a restart, loader stalls, loss spikes, slow and "
        "late nodes, agent restarts, clock skew",
        _nothing,
        realism=True,
        realism_overrides=DENSE_NOISE,
    ),
    "demo": Scenario(
        "demo",
        f"healthy, then every --fault-every seconds a random fault ({', '.join(HARDWARE_FAULTS)}) on a random "
        "node, repaired before the next",
        _demo,
    ),
}


# The metric-only family: each counter fault, the straggler and a healthy job, seen through dcgm-exporter alone.
METRICS_ONLY_PREFIX = "metrics_only_"
_METRICS_ONLY_KINDS = ("straggler", *COUNTER_FAULT_KINDS)
SCENARIOS.update(
    {
        f"{METRICS_ONLY_PREFIX}healthy": Scenario(
            f"{METRICS_ONLY_PREFIX}healthy",
            "healthy, seen through dcgm-exporter alone (no logs, no processes; the job known by its rank map)",
            _nothing,
            metrics_only=True,
        ),
        **{
            f"{METRICS_ONLY_PREFIX}{k}": Scenario(
                f"{METRICS_ONLY_PREFIX}{k}",
                f"{FAULT_KINDS[k].description}; seen through dcgm-exporter alone",
                _one(k),
                metrics_only=True,
            )
            for k in _METRICS_ONLY_KINDS
        },
    }
)


def describe() -> str:
    width = max(len(n) for n in SCENARIOS)
    return "\n".join(f"{s.name:<{width}}  {s.description}" for s in SCENARIOS.values())
