"""The check suite at a level, with a timeout per check, refusing while a job's ranks run on the node.

Levels (each includes the ones below it):
  1  seconds: NVML driver state, host memory/pressure/disk, RDMA ports, `dcgmi diag -r 1`
  2  minutes (target: <= 5 on an 8-GPU node): `dcgmi diag -r 2`, bf16 GEMM, memory and host-to-device bandwidth,
     numerics (together, `compute`, in one child process), all-reduce across the node's GPUs
  3  `dcgmi diag -r 3` (up to half an hour) and, when the service names a peer, the cross-node all-reduce; it runs
     first, so that the two nodes (each told by its own directive, a ship interval apart at most) meet at once,
     and the peer, a known-good node, runs only that check (`only`)
The RDMA ports' error counters are read before the first check and after the last, so the traffic of the
all-reduces in between shows in them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agents.checks import collectives, compute, dcgm, driver, host
from agents.checks.collectives import Peer
from agents.checks.network import PortWatch
from agents.checks.result import CheckResult

log = logging.getLogger(__name__)

LEVELS = (1, 2, 3)


class Refused(Exception):
    """The node still runs a job's ranks: checks would slow or break it."""


@dataclass
class Options:
    level: int = 2
    force: bool = False
    peer: Peer | None = None
    only: list[str] | None = None  # run just these checks of the level (the peer of a cross-node all-reduce)
    volumes: list[str] = field(default_factory=list)
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    kernel_log: str = "auto"  # the kernel log the agent follows (--kmsg): where the Xids since boot are read
    compute_timeout_s: float = 240.0  # the four compute checks on every GPU, PyTorch's start included
    collective_timeout_s: float = 180.0


Check = tuple[str, float, Callable[[], list[CheckResult]]]  # (name, timeout s, run)


def plan(options: Options) -> list[Check]:
    """The checks of a level, in order, each with its timeout."""
    level = options.level
    checks: list[Check] = [
        ("nvml_state", 30.0, lambda: driver.run(kernel_log=options.kernel_log)),
        (
            "host",
            10.0,
            lambda: host.run(procfs_root=options.procfs_root, sysfs_root=options.sysfs_root, volumes=options.volumes),
        ),
        ("dcgm", dcgm.TIMEOUT_S[min(level, 3)] + 10, lambda: dcgm.run(min(level, 3))),
    ]
    if level >= 2:
        checks.append(
            ("compute", options.compute_timeout_s, lambda: compute.run_isolated(timeout=options.compute_timeout_s))
        )
        checks.append(
            (
                "allreduce_node",
                options.collective_timeout_s + 10,
                lambda: [
                    collectives.run(
                        "allreduce_node", timeout=options.collective_timeout_s, procfs_root=options.procfs_root
                    )
                ],
            )
        )
    if level >= 3 and options.peer is not None:
        peer, timeout, procfs = options.peer, options.collective_timeout_s, options.procfs_root
        checks.insert(
            0,
            (
                "allreduce_peer",
                timeout + 10,
                lambda: [collectives.run("allreduce_peer", peer=peer, timeout=timeout, procfs_root=procfs)],
            ),
        )
    if options.only is not None:
        unknown = set(options.only) - {name for name, _, _ in checks}
        if unknown:
            raise ValueError(f"no check {', '.join(sorted(unknown))} at level {level}")
        checks = [check for check in checks if check[0] in options.only]
    return checks


def run_one(name: str, timeout: float, call: Callable[[], list[CheckResult]]) -> list[CheckResult]:
    """The check's results; a check that raises or outlives its timeout fails (a hung GPU is a finding)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["results"] = call()
        except Exception as exc:
            log.exception("check %s failed to run", name)
            box["error"] = f"{type(exc).__name__}: {exc}"[:500]

    started = time.monotonic()
    # A daemon thread: Python cannot stop a thread stuck in a CUDA call; the agent carries on without it.
    thread = threading.Thread(target=target, name=f"check-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    took = round(time.monotonic() - started, 2)
    if thread.is_alive():
        return [
            CheckResult(name, "node", "fail", evidence={"reason": f"timed out after {timeout:g} s"}, duration_s=took)
        ]
    if "error" in box:
        return [CheckResult(name, "node", "fail", evidence={"reason": box["error"]}, duration_s=took)]
    return list(box["results"])


def run_suite(
    options: Options, *, busy_ranks: Iterable[Any] = (), checks: list[Check] | None = None
) -> list[CheckResult]:
    """Every check of the level; raises Refused while `busy_ranks` (a job's training processes) is not empty."""
    if options.level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, not {options.level}")
    busy = list(busy_ranks)
    if busy and not options.force:
        raise Refused(f"{len(busy)} training processes run on this node; drain it first, or force")
    planned = checks if checks is not None else plan(options)  # raises ValueError on an unknown `only`
    watch = PortWatch(options.sysfs_root)
    watch.start()
    results: list[CheckResult] = []
    for name, timeout, call in planned:
        log.info("check %s (timeout %g s)", name, timeout)
        results += run_one(name, timeout, call)
    results += watch.finish()
    return results


def verdict(results: Iterable[CheckResult]) -> str:
    """fail when any check failed, else pass (checks not available do not pass a node on their own)."""
    statuses = {r.status for r in results}
    if "fail" in statuses:
        return "fail"
    return "pass" if "pass" in statuses else "not_available"
