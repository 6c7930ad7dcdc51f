"""The eval's scenario catalog: which scenarios exist, how each is run, and how long to wait for a decision."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lab.sim.scenarios import (
    FLAP_OFF_S,
    FLAP_ON_S,
    METRICS_ONLY_PREFIX,
    NVL72_FAULT_KINDS,
    SCENARIOS,
    TWO_FAULTS_GAP_S,
)

SIM = "sim"
TORCH = "torch"

# How long after the injection a scenario may take to be decided (the hang's depends on the job's timeout).
DEFAULT_WAIT_S = 90.0
STRAGGLER_WAIT_S = 240.0
HANG_EXTRA_WAIT_S = 60.0
# The port flaps are spread over about a minute: the last one comes ~50 s after the injection.
FLAP_WAIT_S = 120.0
# Faults only peer comparison over its continuity window (~2 minutes) can tell: as long as a straggler.
SLOW_FAULTS = frozenset({"straggler", "ib_congestion", "pcie_downgrade", "host_mem_pressure", "software_slow"})
FLAP_FAULTS = frozenset({"ib_port_flap", "ib_port_flap_nccl"})
# Issue 17's harder faults. two_faults: the straggler is decided like one, then the Xid comes TWO_FAULTS_GAP_S
# after it (the deadline counts from the first injection).
TWO_FAULTS_WAIT_S = TWO_FAULTS_GAP_S + DEFAULT_WAIT_S
# Counter climbs judged against the job's peers, and the remap failure (20-40 s after the first remapped row):
# the issue-30 targets, 5 and 2 minutes.
COUNTER_CLIMB_WAIT_S = 300.0
REMAP_FAILURE_WAIT_S = 120.0
COUNTER_CLIMBS = frozenset({"pcie_replay_climb", "nvlink_crc_climb"})
# Scenarios with a fault still to come after the first decision: watched to their deadline, never settled early.
MULTI_FAULT = frozenset({"two_faults"})
# The flapping straggler is slow a quarter of the time: four of its cycles.
INTERMITTENT_WAIT_S = 4 * (FLAP_ON_S + FLAP_OFF_S)
# A hang inside a checkpoint shows only once the other ranks finish saving (the forced save lasts <= 35 s).
CHECKPOINT_SAVE_S = 35.0


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str  # sim | torch
    fault: str | None  # the fault kind, as the ground truth names it; None: healthy
    description: str


@dataclass(frozen=True)
class TorchFault:
    """How a torchrun scenario injects its fault into train.py, and what the ground truth says about it."""

    kind: str
    flags: tuple[str, ...]  # train.py flags; {rank} and {step} are filled in
    marker: str  # regex of the log line that shows the fault has happened; {rank} and {step} filled in
    blame: str
    expect_eviction: bool
    eviction_optional: bool = False
    on_rank: bool = True  # a fault of one rank (and so of one node)

    def pattern(self, rank: int | None, step: int) -> re.Pattern[str]:
        """The marker for this rank and step, matched against single log lines."""
        return re.compile(self.marker.format(rank=rank if rank is not None else "", step=step, prev=step - 1))


TORCH_FAULTS: dict[str, TorchFault] = {
    "torch_hang": TorchFault(
        "hang",
        ("--hang-rank={rank}", "--hang-at-step={step}"),
        r"injected fault: rank {rank} stuck in data loading at step {step}",
        "infrastructure",
        True,
    ),
    # One rank raises a plain RuntimeError with no hardware evidence: the machine is a suspect, but whether to
    # evict it or only diagnose it is the policy's call, so neither counts against the service.
    "torch_crash": TorchFault(
        "crash",
        ("--crash-rank={rank}", "--crash-at-step={step}"),
        r"RuntimeError: injected fault: rank {rank} crashed at step {step}",
        "unknown",
        False,
        eviction_optional=True,
    ),
    # The slow rank's step {step} is the first slow one: it starts when the rank prints step {step} - 1.
    "torch_slow": TorchFault(
        "straggler",
        ("--slow-rank={rank}", "--slow-factor=4", "--slow-at-step={step}"),
        r"^\[rank{rank}\]:step={prev} ",
        "infrastructure",
        True,
    ),
    "torch_user_bug": TorchFault(
        "user_bug",
        ("--user-bug-at-step={step}",),
        r"mat1 and mat2 shapes cannot be multiplied",
        "user_code",
        False,
        on_rank=False,
    ),
}

# A healthy torchrun job with real-life behaviour (issue 17): LR warmup, a checkpoint every 40 steps (every rank
# pauses 8 s: no step lines), an evaluation every 25 steps, a data-loader stall on a different rank every 15
# steps, and a restart from the last checkpoint TORCH_RESTART_AFTER_S into the run (the launchers get SIGTERM
# as from a scheduler's preemption, the agents are restarted with them, the steps since the checkpoint repeat).
TORCH_REAL_LIFE_FLAGS = (
    "--warmup-steps=30",
    "--checkpoint-every=40",
    "--checkpoint-seconds=8",
    "--eval-every=25",
    "--eval-iters=5",
    "--stall-every=15",
    "--stall-seconds=2.5",
)
TORCH_RESTART_AFTER_S = 75.0

# The step each torchrun fault fires at: enough steps before it for the service to know normal progress.
TORCH_FAULT_STEP = {"torch_hang": 60, "torch_crash": 60, "torch_slow": 60, "torch_user_bug": 60}

SIM_SCENARIOS = (
    "healthy", "gpu_lost", "ecc_dbe", "nvlink", "ib_flap", "straggler", "hang", "user_bug", "nan_loss",
    # Machine-level signals (issue 16): IB port counters, PCIe link, host memory, row remapping.
    "ib_port_flap", "ib_port_flap_nccl", "ib_congestion", "pcie_downgrade", "host_mem_pressure", "row_remap_pending",
    # A network adapter's own failure (issue 44): mlx5's health poller reports a fatal error, the port stays down.
    "nic_down",
    # Real-life noise and harder faults (issue 17). transient and healthy_real are healthy runs (nothing to find).
    "two_faults", "fault_in_checkpoint", "intermittent_straggler", "hang_in_checkpoint", "software_slow",
    "transient", "healthy_real",
    # GPU-level remediation (issue 18): a fault a reset of the one GPU clears.
    "gpu_reset",
    # Nodes with nothing but dcgm-exporter (issue 30): no logs, no processes, the job known by its rank map.
    *(name for name in SCENARIOS if name.startswith(METRICS_ONLY_PREFIX)),
    # NVLink domains (issue 43): the nodes are trays of one NVL72 rack (4 GPUs each); a switch tray fails (the
    # domain's fault: one domain incident, its trays cordoned, none evicted), or one tray's own links do.
    *NVL72_FAULT_KINDS,
)  # fmt: skip
# Faults that may be decided for a whole NVLink domain (its shared incident's cordons, which belong to no job): the
# eval reads the cordons of the run's nodes as it watches them.
DOMAIN_FAULTS = frozenset(NVL72_FAULT_KINDS)
# Healthy runs with noise: watched like `healthy` (the ground truth has no fault; the transient is under "noise").
HEALTHY_SIM = frozenset({"healthy", "transient", "healthy_real", f"{METRICS_ONLY_PREFIX}healthy"})
TORCH_HEALTHY = frozenset({"torch_healthy_real"})
TORCH_SCENARIOS = (*TORCH_FAULTS, *TORCH_HEALTHY)

CATALOG: dict[str, Scenario] = {
    "healthy": Scenario("healthy", SIM, None, "simulated job training normally: nothing may be evicted"),
    **{
        name: Scenario(
            name,
            SIM,
            None if name in HEALTHY_SIM else name.removeprefix(METRICS_ONLY_PREFIX),
            f"simulated: {SCENARIOS[name].description}" + ("; nothing may be evicted" if name in HEALTHY_SIM else ""),
        )
        for name in SIM_SCENARIOS
        if name != "healthy"
    },
    "torch_hang": Scenario("torch_hang", TORCH, "hang", "real torchrun: one rank stuck in data loading, peers wait"),
    "torch_crash": Scenario("torch_crash", TORCH, "crash", "real torchrun: one rank raises, torchrun ends the job"),
    "torch_slow": Scenario("torch_slow", TORCH, "straggler", "real torchrun: one rank 4x slower, every step slows"),
    "torch_user_bug": Scenario(
        "torch_user_bug", TORCH, "user_bug", "real torchrun: the same exception on every rank (a user's bug)"
    ),
    "torch_healthy_real": Scenario(
        "torch_healthy_real",
        TORCH,
        None,
        "real torchrun, healthy with real-life behaviour: warmup, checkpoints, evaluations, data-loader stalls, a "
        "restart from the last checkpoint; nothing may be evicted",
    ),
}


def wait_after_injection(fault: str | None, hang_timeout_s: float) -> float:
    """Seconds to watch for decisions after the fault is injected."""
    if fault == "hang":
        return hang_timeout_s + HANG_EXTRA_WAIT_S
    if fault == "hang_in_checkpoint":
        return CHECKPOINT_SAVE_S + hang_timeout_s + HANG_EXTRA_WAIT_S
    if fault == "two_faults":
        return TWO_FAULTS_WAIT_S
    if fault == "intermittent_straggler":
        return INTERMITTENT_WAIT_S
    if fault in SLOW_FAULTS:
        return STRAGGLER_WAIT_S
    if fault in COUNTER_CLIMBS:
        return COUNTER_CLIMB_WAIT_S
    if fault == "row_remap_failure":
        return REMAP_FAILURE_WAIT_S
    if fault in FLAP_FAULTS:
        return FLAP_WAIT_S
    return DEFAULT_WAIT_S


def parse_selection(text: str | None, *, torch: bool) -> tuple[list[str], list[str]]:
    """(scenarios to run, problems) from a comma list; `all` or nothing means every scenario (torch if enabled)."""
    if not text or text.strip() == "all":
        return [n for n, s in CATALOG.items() if torch or s.family == SIM], []
    names = [n.strip() for n in text.split(",") if n.strip()]
    problems = [f"unknown scenario {n!r}" for n in names if n not in CATALOG]
    if not torch:
        skipped = [n for n in names if n in CATALOG and CATALOG[n].family == TORCH]
        problems += [f"{n} needs torch, and --no-torch was given" for n in skipped]
    return list(dict.fromkeys(n for n in names if n in CATALOG)), problems
