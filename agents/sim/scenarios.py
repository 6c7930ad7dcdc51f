"""Scenarios: what goes wrong, where and when (the plan), and the ground truth each fault carries.

How a fault acts on the cluster lives in the model (`Cluster._inject_<kind>`); here only the plan.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from agents.sim.config import SimConfig


@dataclass(frozen=True)
class FaultKind:
    name: str
    description: str
    blame: str  # "infrastructure" | "user_code" | "none"
    expect_eviction: bool
    on_gpu: bool  # the fault has a faulty node and GPU


FAULT_KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind(
            "gpu_lost",
            "a GPU falls off the bus (Xid 79): its series vanish, its rank hangs, peers hit the watchdog",
            "infrastructure",
            True,
            True,
        ),
        FaultKind(
            "ecc_dbe",
            "uncorrectable ECC error (Xid 48, then 63): DBE counters rise, the rank dies with a CUDA error",
            "infrastructure",
            True,
            True,
        ),
        FaultKind(
            "nvlink",
            "NVLink errors (Xid 74) and rising CRC/replay counters on one GPU; the whole job slows",
            "infrastructure",
            True,
            True,
        ),
        FaultKind(
            "ib_flap",
            "an InfiniBand link flaps twice: NCCL IB error 12 on the node, then its rank fails and peers time out",
            "infrastructure",
            True,
            True,
        ),
        FaultKind(
            "straggler",
            "one GPU throttles (thermal): low SM clock and power, hot; every step ~40% slower; no error line",
            "infrastructure",
            True,
            True,
        ),
        FaultKind(
            "hang",
            "one rank stuck in its data loader, all others wait in all_reduce; silent until the (long) watchdog",
            "infrastructure",
            True,
            True,
        ),
        FaultKind(
            "user_bug",
            "the same RuntimeError traceback on every rank, then torchrun's ChildFailedError; no faulty node",
            "user_code",
            False,
            False,
        ),
        FaultKind(
            "nan_loss",
            "loss and grad norm become nan from the injection on; training goes on; no faulty node",
            "user_code",
            False,
            False,
        ),
    )
}

# What `demo` draws from: faults that have a machine to blame.
HARDWARE_FAULTS = ("gpu_lost", "ecc_dbe", "nvlink", "ib_flap", "straggler")


@dataclass(frozen=True)
class FaultSpec:
    """One planned injection. Times are simulated seconds since the start."""

    at: float
    kind: str
    node: int | None = None
    gpu: int | None = None
    repair_at: float | None = None


Plan = Callable[[SimConfig, random.Random], Iterator[FaultSpec]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    plan: Plan


def _nothing(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
    return iter(())


def _one(kind: str) -> Plan:
    def plan(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
        if FAULT_KINDS[kind].on_gpu:
            yield FaultSpec(config.fault_after, kind, rng.randrange(config.nodes), rng.randrange(config.gpus_per_node))
        else:
            yield FaultSpec(config.fault_after, kind)

    return plan


def _demo(config: SimConfig, rng: random.Random) -> Iterator[FaultSpec]:
    # Healthy until fault_after, then a fault every fault_every seconds; each one is repaired (node fixed, job
    # restarted) after two thirds of the period, so the next one starts from a healthy cluster.
    at = config.fault_after
    hold = max(config.fault_every * 2 / 3, min(config.fault_every - 1.0, config.watchdog_seconds + 10.0))
    bag: list[str] = []
    last = None
    while True:
        if not bag:  # every kind once per round, in random order, never the same twice in a row
            bag = list(HARDWARE_FAULTS)
            rng.shuffle(bag)
            if bag[-1] == last:
                bag[0], bag[-1] = bag[-1], bag[0]
        kind = last = bag.pop()
        node, gpu = rng.randrange(config.nodes), rng.randrange(config.gpus_per_node)
        yield FaultSpec(at, kind, node, gpu, repair_at=at + hold)
        at += config.fault_every


SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario("healthy", "nothing happens: a synchronous job training normally", _nothing),
    **{k: Scenario(k, FAULT_KINDS[k].description, _one(k)) for k in FAULT_KINDS},
    "demo": Scenario(
        "demo",
        f"healthy, then every --fault-every seconds a random fault ({', '.join(HARDWARE_FAULTS)}) on a random "
        "node, repaired before the next",
        _demo,
    ),
}


def describe() -> str:
    width = max(len(n) for n in SCENARIOS)
    return "\n".join(f"{s.name:<{width}}  {s.description}" for s in SCENARIOS.values())
