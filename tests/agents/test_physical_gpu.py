"""Which of the node's GPUs a training process uses, from its environment (agents/procs.py)."""

from __future__ import annotations

import pytest

from agents.procs import physical_gpu


@pytest.mark.parametrize(
    ("visible", "local_rank", "gpu"),
    [
        ("", 3, 3),  # every GPU visible: cuda:LOCAL_RANK
        ("5", 0, 5),  # one GPU per task (Slurm --gpus-per-task=1): that GPU
        ("5", None, 5),
        ("4,5,6,7", 1, 5),  # a node split between two jobs: the local rank indexes the visible list
        ("4, 5", 1, 5),
        ("GPU-3f2a,GPU-77c1", 1, 1),  # UUIDs: the local rank is the best guess
        ("4,5", 2, 2),  # a local rank past the list: the variable cannot be read, the rank is kept
        ("", None, None),
    ],
)
def test_the_gpu_of_a_worker(visible: str, local_rank: int | None, gpu: int | None) -> None:
    assert physical_gpu(visible, local_rank) == gpu
