"""Settings of one simulated cluster run (shared by the CLI, the demo and the tests)."""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 4
    gpus_per_node: int = 8
    scenario: str = "healthy"
    # None: a random seed, printed at start so a run can be replayed.
    seed: int | None = None
    job_id: str | None = None
    # Node names are PREFIX000, PREFIX001, ...: distinct prefixes keep runs that share a service apart.
    node_prefix: str = "node-"
    # A simulated training step takes about this long (the straggler makes it 30-50% longer).
    step_seconds: float = 1.0
    fault_after: float = 30.0
    fault_every: float = 120.0
    # NCCL watchdog, scaled down from PyTorch's 10 minutes so faults end the job quickly...
    watchdog_seconds: float = 20.0
    # ...except in the `hang` scenario, where the long watchdog is the point: a hang must be caught before it.
    hang_watchdog_seconds: float = 600.0
    # Wall-clock time of simulated t=0 (timezone-aware); None: now.
    start: datetime | None = None

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

    def resolved(self) -> SimConfig:
        """Fill in seed, job id and start time, so every later reader sees the same values."""
        seed = self.seed if self.seed is not None else secrets.randbelow(2**31)
        job_id = self.job_id or f"sim-{self.scenario}-{secrets.token_hex(3)}"
        start = self.start or datetime.now().astimezone()
        return replace(self, seed=seed, job_id=job_id, start=start)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_names(self) -> list[str]:
        return [node_name(i, self.node_prefix) for i in range(self.nodes)]


def node_name(index: int, prefix: str = "node-") -> str:
    return f"{prefix}{index:03d}"
