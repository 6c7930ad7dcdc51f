"""Settings of one simulated cluster run (shared by the CLI, the demo and the tests)."""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RealismParams:
    """Rates and sizes of real-life healthy noise (lab/sim/realism.py); times in simulated seconds.

    A `*_every_s` is the mean gap between two events (exponentially distributed, or fixed for checkpoints and
    evaluations, which trainers run on an interval); a (low, high) pair is drawn uniformly per event.
    """

    checkpoint_every_s: float = 300.0  # save interval; the first save comes at a random point of the first interval
    checkpoint_s: tuple[float, float] = (20.0, 40.0)  # every rank pauses this long (tens of seconds)
    checkpoint_write_bytes_per_s: float = 2.5e9  # extra storage NIC traffic per node while saving
    eval_every_s: float = 420.0  # evaluation interval (Megatron's --eval-interval, in time)
    eval_iters: int = 10  # forward-only steps of one evaluation
    eval_step_share: float = 0.4  # an evaluation step's length relative to a training step
    restart_every_s: float = 3600.0  # a job restart from its last checkpoint (preemption, requeue)
    first_restart_s: float = 0.0  # when the first restart comes; 0: drawn like the others
    restart_down_s: tuple[float, float] = (25.0, 50.0)  # processes gone before the job comes back
    restart_load_s: float = 8.0  # loading the checkpoint before the first step
    loader_stall_every_s: float = 600.0  # one rank's data loader stalls, then recovers
    loader_stall_s: tuple[float, float] = (2.0, 6.0)
    warmup_iters: int = 300  # the job starts fresh: learning rate ramps up linearly over these steps
    loss_spike_every_s: float = 900.0
    loss_spike_factor: tuple[float, float] = (1.3, 2.2)  # the loss jumps by this factor...
    loss_spike_steps: float = 25.0  # ...and decays back with this time constant, in steps
    node_speed_sd: float = 0.015  # per-node compute speed, within normal variation
    node_speed_max: float = 0.04
    thermal_drift_c: float = 3.0  # amplitude of the inlet temperature's daily swing
    day_s: float = 86400.0  # length of a simulated day (shorten it to see the drift in a short run)
    late_join_nodes: int = 1  # nodes whose agent starts reporting late
    late_join_s: tuple[float, float] = (20.0, 60.0)
    agent_restart_every_s: float = 900.0  # per node: the agent process is restarted (upgrade, OOM kill)
    agent_down_s: tuple[float, float] = (2.0, 8.0)
    agent_kill_share: float = 0.3  # of agent restarts, those by SIGKILL rather than SIGTERM
    clock_skew_sd_s: float = 2.0  # each node's clock offset (logs and samples)
    clock_skew_max_s: float = 5.0

    def with_overrides(self, items: dict[str, str]) -> RealismParams:
        """A copy with fields set from text (`checkpoint_s` takes `20,40`); ValueError naming a bad one."""
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for name, text in items.items():
            if name not in known:
                raise ValueError(f"unknown realism parameter {name!r}; known: {', '.join(known)}")
            current = getattr(self, name)
            try:
                if isinstance(current, tuple):
                    low, high = (float(x) for x in text.split(","))
                    if low > high:
                        raise ValueError
                    changes[name] = (low, high)
                else:
                    value = type(current)(text)
                    if value < 0:
                        raise ValueError
                    changes[name] = value
            except ValueError:
                raise ValueError(f"realism parameter {name}: bad value {text!r}") from None
        return replace(self, **changes)


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 4
    gpus_per_node: int = 8
    # Idle machines beside the job's, which the closed loop (lab/sim/actions.py) swaps in for an evicted node.
    spares: int = 0
    # Closed loop, simulated seconds: an evicted node is repaired this long before it rejoins the spare pool; a
    # node sent to `diagnose` is checked this long; the job comes back this long after losing a node.
    repair_seconds: float = 600.0
    check_seconds: float = 120.0
    restart_seconds: float = 20.0
    # True: a node sent to `diagnose` answers the service's run_checks with results from its fault (its agent's
    # suite on the simulated GPUs, lab/sim/gpuanswers.py; in-process in the accelerated campaign, lab/sim/checks.py)
    # and waits for the verdict the service draws from them (evict, or return); a person settles a check nobody
    # answered after `check_wait_seconds`. False: the check is the placeholder (`pool.check_machine`), settled after
    # `check_seconds` without the service.
    service_checks: bool = False
    check_wait_seconds: float = 900.0
    scenario: str = "healthy"
    # None: a random seed, printed at start so a run can be replayed.
    seed: int | None = None
    job_id: str | None = None
    # Node names are PREFIX000, PREFIX001, ...: distinct prefixes keep runs that share a service apart.
    node_prefix: str = "node-"
    # A simulated training step takes about this long (the straggler makes it 30-50% longer).
    step_seconds: float = 1.0
    fault_after: float = 30.0
    # A one-fault scenario's node rank; None: drawn by the plan. (Tests put one fault on every node in turn.)
    fault_node: int | None = None
    fault_every: float = 120.0
    # NCCL watchdog, scaled down from PyTorch's 10 minutes so faults end the job quickly...
    watchdog_seconds: float = 20.0
    # ...except in the `hang` scenario, where the long watchdog is the point: a hang must be caught before it.
    hang_watchdog_seconds: float = 600.0
    # Wall-clock time of simulated t=0 (timezone-aware); None: now.
    start: datetime | None = None
    # Real-life healthy noise (checkpoints, evaluations, restarts, stalls, skew, ...); off keeps every scenario
    # exactly as before. Some scenarios switch it on themselves (Scenario.realism).
    realism: bool = False
    realism_params: RealismParams = field(default_factory=RealismParams)
    # The nodes are compute trays of one GB200 NVL72 rack (4 GPUs each, one NVLink domain: lab/sim/nvl72.py); the
    # NVLink-domain scenarios switch it on themselves (Scenario.nvl72).
    nvl72: bool = False

    # Runner only.
    duration: float | None = None
    dir: Path = Path(".faultline/sim")
    server: str | None = None
    token: str | None = None
    # The agents' ship interval (passed as `--interval`, its older name) and sample interval (None: the
    # agent's default, min(1 s, ship interval)). Shipping every second keeps scenarios quick.
    interval: float = 1.0
    sample_interval: float | None = None
    agents: bool = True
    # The agent program; the runner appends the per-node flags. Default: this Python's `faultline agent`.
    agent_command: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "faultline", "agent"))
    host: str = "127.0.0.1"
    port: int = 0
    # With a scheduler token, the scheduler stand-in (lab/sim/scheduler.py) acts on the service's decisions.
    scheduler_token: str | None = None

    def resolved(self) -> SimConfig:
        """Fill in seed, job id and start time, so every later reader sees the same values."""
        seed = self.seed if self.seed is not None else secrets.randbelow(2**31)
        job_id = self.job_id or f"sim-{self.scenario}-{secrets.token_hex(3)}"
        start = self.start or datetime.now().astimezone()
        return replace(self, seed=seed, job_id=job_id, start=start)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def machines(self) -> int:
        """The job's nodes, then the spares."""
        return self.nodes + self.spares

    def node_names(self) -> list[str]:
        """Every machine's name: the job's first nodes (in node-rank order at the start), then the spares."""
        return [node_name(i, self.node_prefix) for i in range(self.machines)]


def node_name(index: int, prefix: str = "node-") -> str:
    return f"{prefix}{index:03d}"
