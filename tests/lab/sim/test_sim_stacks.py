"""The stacks a simulated rank shows without a process (lab/sim/stacks.py): the accelerated-time harnesses'
agents answer stack requests with them, and the service's stack analysis reads them as it reads real dumps."""

from __future__ import annotations

from lab.sim import stacks
from lab.sim.gpu import COMPUTE, NONE, WAIT
from lab.sim.modes import CRASH_ECC, CULPRIT_DATA, NORMAL, VICTIM
from ml.findings import JobInfo, StackSample
from ml.stacks.analysis import analyze


def _sample(rank: int, names: list[str]) -> StackSample:
    pid = 1000 + rank
    return StackSample(rank=rank, node=f"n{rank // 2}", pid=pid, threads=stacks.pyspy_threads(pid, names))


def test_a_hang_culprit_stuck_in_its_data_loader_is_named_by_the_stack_analysis() -> None:
    job = JobInfo(job_id="j", world_size=8, rank_nodes={r: f"n{r // 2}" for r in range(8)})
    modes = {r: VICTIM for r in range(8)} | {5: CULPRIT_DATA}
    samples = []
    for rank, mode in modes.items():
        names = stacks.frames(mode, NONE)
        assert names is not None and names[-1] == "<module>"
        samples.append(_sample(rank, names))
    result = analyze(job, samples)
    assert result.culprit_ranks == [5]
    assert [node for node, _, _ in result.suspects][:1] == ["n2"]


def test_frames_follow_the_activity_of_a_normal_rank_and_a_dead_rank_has_none() -> None:
    assert stacks.frames(NORMAL, COMPUTE)[:2] == ["run_kernels", "forward"]
    assert stacks.frames(NORMAL, WAIT)[:2] == ["_wait_for_work", "all_reduce"]
    assert stacks.frames(NORMAL, NONE) is None  # the job is down: no training process
    assert stacks.frames(CRASH_ECC, COMPUTE) is None
