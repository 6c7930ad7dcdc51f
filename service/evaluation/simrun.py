"""`faultline sim` with per-run node names: `python -m service.evaluation.simrun PREFIX <faultline sim flags>`.

The sim always names its nodes node-000, node-001, ... The service keeps a node's history across jobs (kernel
lines within the diagnosis window, eviction cooldowns), so scenarios run one after the other, or side by side,
on the same names would see each other's faults. Here every run gets its own names, PREFIX-node-000, ...,
everywhere the sim uses them (agents, log lines, ground truth), since they all come from `SimConfig.node_names`.
"""

from __future__ import annotations

import sys

from agents.sim import config


def main(argv: list[str]) -> int:
    if len(argv) < 1 or not argv[0]:
        print("usage: python -m service.evaluation.simrun PREFIX [faultline sim options]", file=sys.stderr)
        return 2
    prefix, rest = argv[0], argv[1:]
    original = config.node_name

    def node_name(index: int) -> str:
        return f"{prefix}-{original(index)}"

    config.node_name = node_name
    from faultline.cli import main as faultline_main

    return faultline_main(["sim", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
