"""What passes between a benchmark and its load generator process (lab/bench/loadgen.py): the
configuration it reads on stdin, and what each phase saw, as the result reports it."""

from __future__ import annotations

import json
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class LoadConfig:
    host: str
    port: int
    token: str
    nodes: int
    gpus_per_node: int
    ship_interval: float
    sample_interval: float
    duration: float
    connections: int
    capacity_seconds: float
    job_id: str
    node_prefix: str
    # The first `step_log_nodes` nodes log a step line per training step of `step_s` seconds.
    step_log_nodes: int = 1
    step_s: float = 1.0
    # One fault (FAULTS) on one node's GPU, `fault_after` seconds into the paced phase; None: healthy.
    fault: str | None = None
    fault_node: int = 0
    fault_gpu: int = 0
    fault_after: float = 0.0
    progress_s: float = 5.0

    @property
    def samples_per_batch(self) -> int:
        return samples_per_batch(self.ship_interval, self.sample_interval)


def samples_per_batch(ship_interval: float, sample_interval: float) -> int:
    """Samples per GPU in one batch; the ship interval must be a whole number of sample intervals."""
    ratio = ship_interval / sample_interval
    if ratio < 1 - 1e-6 or abs(ratio - round(ratio)) > 1e-6:
        raise ValueError(
            f"the ship interval ({ship_interval:g} s) must be a whole multiple of the sample interval "
            f"({sample_interval:g} s)"
        )
    return round(ratio)


@dataclass
class PhaseStats:
    """What one phase saw. Latency counts from the scheduled send time (queueing included); service
    time from the moment the request was written."""

    name: str
    samples_per_request: int
    scheduled: int = 0  # requests due in the phase (paced only)
    sent: int = 0
    ok: int = 0
    errors: int = 0
    unsent: int = 0
    elapsed_s: float = 0.0
    last_done: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    latency: array[float] = field(default_factory=lambda: array("d"))
    service: array[float] = field(default_factory=lambda: array("d"))
    problems: list[str] = field(default_factory=list)
    # Answers asking the agent for stack dumps (the load generator does not dump stacks: it has no processes).
    directives: int = 0
    stopped_early: bool = False

    def record(self, status: int, latency: float, service: float, body: bytes) -> None:
        self.statuses[status] += 1
        self.latency.append(latency)
        self.service.append(service)
        if 200 <= status < 300:
            self.ok += 1
            if b"dump_stacks" in body:
                self.directives += 1
        elif len(self.problems) < 5:
            self.problems.append(f"HTTP {status}: {body[:300].decode(errors='replace')}")

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        if len(self.problems) < 5:
            self.problems.append(f"{type(exc).__name__}: {exc}")

    def summary(self) -> dict[str, Any]:
        elapsed = self.elapsed_s or float("nan")
        return {
            "requests_scheduled": self.scheduled,
            "requests_sent": self.sent,
            "requests_ok": self.ok,
            "non_2xx": sum(n for status, n in self.statuses.items() if not 200 <= status < 300),
            "errors": self.errors,
            "unsent": self.unsent,
            # cut off by the hung-server timeout: the server may or may not have stored them
            "unanswered": self.sent - len(self.latency) - self.errors,
            "statuses": {str(status): n for status, n in sorted(self.statuses.items())},
            "ok_samples": self.ok * self.samples_per_request,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests_per_s": self.ok / elapsed,
            "samples_per_s": self.ok * self.samples_per_request / elapsed,
            "latency_ms": percentiles(self.latency),
            "service_ms": percentiles(self.service),
            "directives": self.directives,
            "stopped_early": self.stopped_early,
            "problems": self.problems,
        }


def percentiles(values: array[float] | list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    last = len(ordered) - 1
    return {
        "p50": round(ordered[round(0.50 * last)] * 1000, 2),
        "p99": round(ordered[round(0.99 * last)] * 1000, 2),
        "max": round(ordered[-1] * 1000, 2),
    }


def config_json(config: LoadConfig) -> str:
    return json.dumps(asdict(config))
