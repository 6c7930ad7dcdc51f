"""A published fleet's fault mix mapped onto the simulator's fault kinds, and the draw of a campaign's faults.

The mix is Llama 3 405B's pre-training (Meta, "The Llama 3 Herd of Models", 2024, table 5): 419 unexpected
interruptions in 54 days on 16,384 H100s, by root-cause category. Each category's share is kept; within a
category the simulator's kinds that show it share its weight (their relative weights below). The categories
under 1% each (the "rest", 9% together) are the slower, rarer kinds faultline also handles.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from lab.sim.scenarios import FAULT_KINDS, GPU, NODE, SHARED_FAULT_KINDS, FaultSpec


@dataclass(frozen=True)
class Category:
    name: str
    share: float  # percent of the fleet's interruptions
    kinds: tuple[tuple[str, float], ...]  # (fault kind, relative weight within the category)
    # Whether the category has a machine to name (the recall target counts these): a user's bug and a planned
    # drain have none.
    localizable: bool = True


LLAMA3_405B: tuple[Category, ...] = (
    # "Faulty GPU": the GPU drops off the bus, uncorrectable ECC, NVLink errors, a loss in the middle of a save.
    Category("faulty_gpu", 30.1, (("gpu_lost", 3), ("ecc_dbe", 2), ("nvlink", 2), ("fault_in_checkpoint", 1))),
    Category("hbm3", 17.2, (("hbm_remap_failure", 3), ("row_remap_pending", 1))),
    Category("software_bug", 12.9, (("user_bug", 3), ("nan_loss", 1)), localizable=False),
    Category(
        "network_switch_cable",
        8.4,
        (("ib_flap", 1), ("ib_port_flap", 1), ("ib_port_flap_nccl", 1), ("ib_congestion", 1)),
    ),
    Category("host_maintenance", 7.6, (("host_maintenance", 1),), localizable=False),
    Category("gpu_sram", 4.5, (("sram_ecc", 1),)),
    Category("gpu_system_processor", 4.1, (("gpu_reset", 1), ("gsp_error", 1))),
    Category("nic", 1.7, (("nic_down", 1),)),
    Category("nccl_watchdog", 1.7, (("hang", 1),)),
    Category("silent_data_corruption", 1.4, (("sdc", 1),)),
    Category("gpu_thermal", 1.4, (("straggler", 2), ("intermittent_straggler", 1))),
    Category(
        "other",
        9.0,
        (("host_mem_pressure", 1), ("software_slow", 1), ("pcie_downgrade", 1), ("hang_in_checkpoint", 1)),
    ),
)

# Faults of a component several machines share (a leaf switch, a driver rollout, a storage mount, a rack's power):
# not in Llama 3's table by these names (its switch and cable share is counted per machine), drawn at a rate of
# their own (`draws(shared_rate=...)`), the kinds in turn so that a few draws cover each.
SHARED_CATEGORY = "shared_cause"
CATEGORY_OF: dict[str, str] = {
    **{kind: c.name for c in LLAMA3_405B for kind, _ in c.kinds},
    **dict.fromkeys(SHARED_FAULT_KINDS, SHARED_CATEGORY),
}
LOCALIZABLE: frozenset[str] = frozenset(c.name for c in LLAMA3_405B if c.localizable)


@dataclass(frozen=True)
class Draw:
    category: str
    kind: str
    node: int
    gpu: int | None  # None: a fault of the node as a whole (or of the job)


def draw(rng: random.Random, *, nodes: int, gpus_per_node: int, mix: tuple[Category, ...] = LLAMA3_405B) -> Draw:
    """One fault: a category by its share, a kind within it by weight, a node uniformly, a GPU uniformly."""
    category = rng.choices(mix, weights=[c.share for c in mix])[0]
    kind = rng.choices([k for k, _ in category.kinds], weights=[w for _, w in category.kinds])[0]
    # Every fault gets a node drawn, even a job's (user_bug), so the draws that follow do not depend on the kind.
    node, gpu = rng.randrange(nodes), rng.randrange(gpus_per_node)
    scope = FAULT_KINDS[kind].scope
    return Draw(category.name, kind, node, gpu if scope == GPU else None)


def spec_of(d: Draw, at: float) -> FaultSpec:
    """The injection for a draw: a job-wide kind names no node."""
    scope = FAULT_KINDS[d.kind].scope
    node = d.node if scope in (GPU, NODE) else None
    return FaultSpec(at, d.kind, node, d.gpu)


def draws(
    seed: int,
    *,
    nodes: int,
    gpus_per_node: int,
    mix: tuple[Category, ...] = LLAMA3_405B,
    shared_rate: float = 0.0,
    shared_kinds: tuple[str, ...] = SHARED_FAULT_KINDS,
) -> Iterator[Draw]:
    """An endless, reproducible stream of faults for one job; with `shared_rate`, that share of the draws is a
    shared component's fault instead (the kinds in turn), decided by a stream of its own so that the other draws
    stay where they were without it."""
    rng = random.Random(seed)
    shared_rng = random.Random(f"shared:{seed}")
    turn = 0
    while True:
        d = draw(rng, nodes=nodes, gpus_per_node=gpus_per_node, mix=mix)
        if shared_rate > 0 and shared_kinds and shared_rng.random() < shared_rate:
            d = Draw(SHARED_CATEGORY, shared_kinds[turn % len(shared_kinds)], d.node, None)
            turn += 1
        yield d
