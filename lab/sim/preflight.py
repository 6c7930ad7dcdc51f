"""`faultline sim preflight`: the preflight over a simulated allocation, through the product's own search.

A 64-node allocation (by default) of 8-GPU nodes with three faults planted: one slow NIC (its every group runs at a
third of the bandwidth, at twice the latency), one GPU below its fleet criterion (12% slower than its peers: within
its node's 15% but under the fleet's cut-off from ml/check_criteria.py, computed here from a simulated fleet
history) and one broken pair link (a group holding both ends hangs until the probe's timeout). Each node's own
checks go through the check suite's `compute.measure` on a modelled GPU runtime, and its report through the
preflight's `local.report_of`; the rounds through `agents.preflight.search.search`, the very code the nodes run,
with a model of the fabric in place of torch.distributed. No processes: it runs in well under a second.

It also keeps a modelled clock of what the real preflight would take (start-up of a group's ranks, the transfer,
the probe timeouts of the hanging groups, the adaptive timeout `probe_timeout`), and stops the search at the
deadline on that clock, as the nodes would.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from agents.checks import compute
from agents.preflight import local
from agents.preflight.report import render
from agents.preflight.runner import as_plain
from agents.preflight.search import Criteria, Figures, Group, LocalReport, Outcome, Round, probe_timeout, search
from ml.check_criteria import criterion

MODEL = "NVIDIA H100 80GB HBM3"
GEMM_TFLOPS = 790.0  # an H100's bf16 GEMM in PyTorch (tests/fixtures/checks/README.md: 797.5 measured)
BUSBW_GBPS = 360.0  # all-reduce bus bandwidth between 8-GPU nodes with eight 400 Gb/s NICs
LATENCY_US = 35.0
STARTUP_S = 4.0  # a group's ranks: processes, PyTorch, NCCL's communicator
PROBE_TIMEOUT_S = 30.0
BYTES, ITERS = 64 * 2**20, 10


@dataclass
class Allocation:
    """The simulated nodes and what is wrong with them."""

    nodes: list[str]
    gpus: int = 8
    slow_nic: set[str] = field(default_factory=set)
    slow_gpu: dict[str, int] = field(default_factory=dict)  # node -> the GPU below its criterion
    broken: list[tuple[str, str]] = field(default_factory=list)
    seed: int = 0

    @property
    def planted(self) -> set[str]:
        return self.slow_nic | set(self.slow_gpu) | {n for pair in self.broken for n in pair}


def plant(nodes: int, *, seed: int) -> Allocation:
    """One slow NIC, one slow GPU, one broken pair, on distinct nodes drawn at random."""
    rng = random.Random(seed)
    names = [f"node-{i:03d}" for i in range(nodes)]
    slow, gpu, a, b = rng.sample(names, 4)
    return Allocation(names, slow_nic={slow}, slow_gpu={gpu: rng.randrange(8)}, broken=[(a, b)], seed=seed)


class ModelGpus:
    """The check suite's `Compute` protocol on modelled GPUs: their GEMM figures with a little noise."""

    def __init__(self, alloc: Allocation, node: str, rng: random.Random) -> None:
        self.alloc, self.node, self.rng = alloc, node, rng

    def devices(self) -> list[tuple[int, str]]:
        return [(i, MODEL) for i in range(self.alloc.gpus)]

    def gemm_tflops(self, gpu: int) -> float:
        slow = self.alloc.slow_gpu.get(self.node) == gpu
        return GEMM_TFLOPS * (0.88 if slow else 1.0) * self.rng.gauss(1.0, 0.006)

    def memory_gbps(self, gpu: int) -> float:
        raise NotImplementedError  # the preflight measures the GEMM only

    h2d_gbps = memory_gbps

    def gemm_digest(self, gpu: int) -> str:
        raise NotImplementedError


def fleet_floor(rng: random.Random, runs: int = 500) -> float:
    """The fleet's cut-off for this model's GEMM, from a simulated history of passing runs (ml/check_criteria.py)."""
    rule = criterion([GEMM_TFLOPS * rng.gauss(1.0, 0.01) for _ in range(runs)])
    assert rule.cutoff is not None
    return rule.cutoff


class Fabric:
    """torch.distributed's place: a group's figures, and a modelled clock of how long measuring them takes."""

    def __init__(self, alloc: Allocation, rng: random.Random) -> None:
        self.alloc, self.rng = alloc, rng
        self.clock_s = 0.0
        self.last_s = 0.0
        self.finished: list[float] = []
        self.ceiling = PROBE_TIMEOUT_S

    def __call__(self, groups: list[Group]) -> list[Figures]:
        timeout = probe_timeout(self.finished, ceiling=self.ceiling)
        out: list[Figures] = []
        for group in groups:
            if any(a in group and b in group for a, b in self.alloc.broken):
                out.append(Figures(error=f"timed out after {timeout:.0f} s", seconds=timeout))
                continue
            slow = any(n in self.alloc.slow_nic for n in group)
            busbw = BUSBW_GBPS * (1 / 3 if slow else 1.0) * self.rng.gauss(1.0, 0.02)
            latency = (
                LATENCY_US * (2.0 if slow else 1.0) * (1 + 0.1 * len(group).bit_length()) * self.rng.gauss(1, 0.03)
            )
            n = len(group)
            seconds = STARTUP_S + ITERS * BYTES * 2 * (n - 1) / n / (busbw * 1e9) + self.rng.uniform(0, 0.5)
            out.append(Figures(busbw, latency, seconds=seconds))
        self.finished.extend(f.seconds for f in out if f.seconds is not None and not f.error)
        self.last_s = max((f.seconds or 0.0) for f in out)  # the round's groups run at once
        self.clock_s += self.last_s
        return out


def run(alloc: Allocation, *, deadline_s: float = 180.0, local_s: float = 25.0) -> tuple[Outcome, Fabric, float]:
    """The preflight over the allocation: (its outcome, the fabric with its modelled clock, the local checks' s)."""
    rng = random.Random(alloc.seed)
    reports: dict[str, LocalReport] = {}
    for node in alloc.nodes:
        results = compute.measure(ModelGpus(alloc, node, rng), "gemm_bf16")
        reports[node] = local.report_of(node, results)
    criteria = Criteria(local_floors={"gemm_tflops": fleet_floor(rng)})
    fabric = Fabric(alloc, rng)
    fabric.clock_s = local_s  # the nodes' own checks first, all at once

    def stop() -> bool:
        return fabric.clock_s + probe_timeout(fabric.finished, ceiling=fabric.ceiling) + 5 > deadline_s

    def modelled(r: Round) -> None:  # the round's time on the modelled clock, not the simulation's
        r.seconds = round(local_s if r.phase == "local" else fabric.last_s, 1)

    outcome = search(alloc.nodes, fabric, local=reports, criteria=criteria, stop=stop, on_round=modelled)
    return outcome, fabric, criteria.local_floors["gemm_tflops"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="faultline sim preflight",
        description="The preflight's search over a simulated allocation with a slow NIC, a GPU below its fleet "
        "criterion and a broken pair link planted. Exit status 0 when exactly the planted nodes are named.",
    )
    p.add_argument("--nodes", type=int, default=64, help="nodes in the allocation (default 64, at least 4)")
    p.add_argument("--seed", type=int, default=7, help="where the faults are planted (default 7)")
    p.add_argument("--deadline", type=float, default=180.0, help="the modelled preflight's deadline, s (default 180)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    args = p.parse_args(argv)
    if args.nodes < 4:
        p.error("--nodes must be at least 4 (three faults on four distinct nodes)")
    started = time.perf_counter()
    alloc = plant(args.nodes, seed=args.seed)
    outcome, fabric, floor = run(alloc, deadline_s=args.deadline)
    wall = time.perf_counter() - started
    named = set(outcome.bad)
    ok = named == alloc.planted
    summary: dict[str, Any] = {
        "planted": {
            "slow_nic": sorted(alloc.slow_nic),
            "slow_gpu": {n: f"gpu:{g}" for n, g in alloc.slow_gpu.items()},
            "broken_pair": [list(p) for p in alloc.broken],
        },
        "fleet_gemm_cutoff_tflops": round(floor, 1),
        "rounds": len(outcome.rounds),
        "measurements": outcome.measurements,
        "named": sorted(named),
        "healthy_named": sorted(named - alloc.planted),
        "missed": sorted(alloc.planted - named),
        "modelled_preflight_s": round(fabric.clock_s, 1),
        "wall_s": round(wall, 3),
        "all_named_and_no_healthy": ok,
    }
    if args.json:
        print(json.dumps({**summary, "outcome": as_plain(outcome)}, indent=1))
        return 0 if ok else 1
    for line in render(as_plain(outcome), max_groups=6):
        print(line)
    print(f"planted: slow NIC {', '.join(sorted(alloc.slow_nic))}; GPU below its criterion "
          f"{', '.join(f'{n} gpu:{g}' for n, g in alloc.slow_gpu.items())} (fleet cut-off {floor:.1f} TFLOPS); "
          f"broken pair {' - '.join(alloc.broken[0])}")  # fmt: skip
    print(
        f"{len(alloc.nodes)} nodes: {len(outcome.rounds)} rounds, {outcome.measurements} group measurements "
        f"(all pairs would be {len(alloc.nodes) * (len(alloc.nodes) - 1) // 2}); modelled preflight "
        f"{fabric.clock_s:.0f} s of a {args.deadline:g} s deadline; wall time {wall:.3f} s"
    )
    print("result: " + ("all three named, no healthy node named" if ok else f"MISMATCH {summary}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
