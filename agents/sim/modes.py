"""Rank modes: what the simulated cluster tells each rank process to do (agents/sim/rank.py acts them out), and
what the model assumes they do."""

from __future__ import annotations

NORMAL, VICTIM, CULPRIT_DATA, CULPRIT_SYNC, TERMINATED, ABORT = (
    "normal",
    "hang_victim",
    "hang_culprit:data",
    "hang_culprit:sync",
    "terminated",
    "abort",
)
CRASH_ECC, CRASH_USER, CRASH_NCCL = "crash:ecc", "crash:user_bug", "crash:nccl"
DEAD = frozenset({TERMINATED, ABORT, CRASH_ECC, CRASH_USER, CRASH_NCCL})
