"""Rank modes: what the simulated cluster tells each rank process to do (lab/sim/rank.py acts them out), and
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

# Checkpoints (lab/sim/realism.py): every rank saving; one stuck inside the save (its write never returns);
# the ranks that finished saving, waiting for it in the barrier after the save.
CHECKPOINT, CULPRIT_CKPT, VICTIM_BARRIER = "checkpoint", "hang_culprit:ckpt", "hang_victim:barrier"
VICTIMS = frozenset({VICTIM, VICTIM_BARRIER})
CULPRITS = frozenset({CULPRIT_DATA, CULPRIT_SYNC, CULPRIT_CKPT})
