"""A real multi-node torchrun job (2 virtual nodes x 2 ranks, PyTorch CPU, gloo) and its injected faults.

These tests prove the harness in lab/evaluation/torchjob/ produces the evidence faultline's agent and
detectors are built for: step lines in each node's log, ranks discoverable from /proc/PID/environ, a hang
that py-spy can see, a crash with a traceback and torchrun's ChildFailedError summary, and a slow rank that
slows everyone.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

if importlib.util.find_spec("torch") is None:  # find_spec, not import: importing torch costs seconds
    pytest.skip(
        "PyTorch CPU not installed: real torchrun tests skipped (pip install torch==2.13.0)", allow_module_level=True
    )

from lab.evaluation.torchjob.cluster import TRAIN_SCRIPT, TorchCluster, launch
from tests.procs import TORCH_STEPS_S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NODES, PROCS = 2, 2
WORLD = NODES * PROCS
SLOW_RANK, SLOW_FACTOR, SLOW_AT_STEP = 2, 4.0, 10


def _py_spy() -> str:
    found = Path(sys.executable).with_name("py-spy")
    if found.exists():
        return str(found)
    path = shutil.which("py-spy")
    if path is None:
        pytest.skip("py-spy not installed: stack dump of the hung job skipped (pip install py-spy)")
    return path


def _stopped(cluster: TorchCluster) -> None:
    """Stop the job and prove nothing of it is left, hung ranks and DataLoader workers included."""
    cluster.stop()
    leftovers = cluster.processes()
    assert not leftovers, f"processes left after stop: {[(p.pid, p.name()) for p in leftovers]}"


@pytest.fixture(scope="class")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchCluster]:
    """A job that trains normally, then rank 2 (node 1) turns slow at step 10, as a fail-slow machine would.

    Shared by the tests of TestRunningJob, which only observe it (every launch costs 6 torch imports, seconds
    on a 2-core machine); class-scoped so it is stopped before the other tests start their own jobs.
    """
    cluster = launch(
        NODES,
        PROCS,
        job_id=f"torchjob-{uuid.uuid4().hex[:8]}",
        log_dir=tmp_path_factory.mktemp("torchjob"),
        extra_args=[
            "--workers=1",
            f"--slow-rank={SLOW_RANK}",
            f"--slow-factor={SLOW_FACTOR}",
            f"--slow-at-step={SLOW_AT_STEP}",
        ],
    )
    try:
        yield cluster
    finally:
        _stopped(cluster)


@pytest.fixture
def new_job(tmp_path: Path) -> Iterator[Any]:
    """Launch a job for one test; it is stopped (and checked for leftovers) even when the test fails."""
    clusters: list[TorchCluster] = []

    def start(*extra_args: str) -> TorchCluster:
        cluster = launch(
            NODES, PROCS, job_id=f"torchjob-{uuid.uuid4().hex[:8]}", log_dir=tmp_path, extra_args=list(extra_args)
        )
        clusters.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in clusters:
            _stopped(cluster)


class TestRunningJob:
    """Progress, rank discovery and fail-slow, observed on one job."""

    def test_job_progresses_on_both_nodes(self, job: TorchCluster) -> None:
        job.wait_for_step(3, timeout=TORCH_STEPS_S)

        for node in range(NODES):
            steps = [s for s in job.steps() if s.node == node]
            # Each node's log carries the progress of its own ranks, in the common format.
            assert {s.rank for s in steps} == {node * PROCS + i for i in range(PROCS)}, job.logs()
            assert all(s.elapsed_ms > 0 and s.loss == s.loss for s in steps)  # loss == loss: not NaN
        assert all(p.poll() is None for p in job.launchers)

    def test_rank_pids_match_torchrun_environment(self, job: TorchCluster) -> None:
        job.wait_for_step(1, timeout=TORCH_STEPS_S)
        procs = job.rank_procs()

        assert sorted(procs) == list(range(WORLD))
        for rank, proc in procs.items():
            assert proc.group_rank == rank // PROCS
            assert proc.local_rank == rank % PROCS
            assert proc.world_size == WORLD
            assert proc.node == proc.group_rank
            # The rank is a child of its node's launcher (the pid `faultline agent --watch-pid` is given)...
            assert psutil.Process(proc.pid).ppid() == job.launchers[proc.node].pid
            # ...and has a DataLoader worker (--workers=1) that shares its environment but is not a rank.
            children = psutil.Process(proc.pid).children()
            assert children, f"rank {rank} has no DataLoader worker"
            assert not {c.pid for c in children} & set(job.rank_pids().values())

    def test_slow_rank_raises_every_ranks_step_time(self, job: TorchCluster) -> None:
        job.wait_for_step(SLOW_AT_STEP + 5, timeout=TORCH_STEPS_S)
        steps = job.steps()

        def median_ms(rank: int, first: int, last: int) -> float:
            return statistics.median(s.elapsed_ms for s in steps if s.rank == rank and first <= s.step <= last)

        # Step 1 includes warm-up and the step at the switch is partly slow: compare the steps around them.
        for rank in range(WORLD):
            before = median_ms(rank, 2, SLOW_AT_STEP - 1)
            after = median_ms(rank, SLOW_AT_STEP + 1, SLOW_AT_STEP + 5)
            # Synchronous training: a rank on the other node waits for the slow one, so its steps slow too.
            assert after / before > 1.5, f"rank {rank}: {before:.1f} ms -> {after:.1f} ms\n{job.logs()}"


def _dump(pid: int) -> list[dict[str, Any]]:
    # py-spy reads another process's memory; on a loaded machine a read can fail once, so try again.
    for _ in range(3):
        out = subprocess.run(
            [_py_spy(), "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
        if out.returncode == 0:
            return json.loads(out.stdout)
        time.sleep(0.5)
    raise AssertionError(f"py-spy dump --pid {pid} failed: {out.stderr}")


def _main_frames(pid: int) -> list[tuple[str, str]]:
    """(function, file) of the main thread, innermost first."""
    main = next(t for t in _dump(pid) if t["thread_name"] == "MainThread")
    return [(f["name"], f["filename"]) for f in main["frames"]]


def _wait_for_top_frame(pid: int, name: str, timeout: float = 20.0) -> list[tuple[str, str]]:
    """The main thread's frames once `name` is the innermost (a peer reaches the collective a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        frames = _main_frames(pid)
        if (frames and frames[0][0] == name) or time.monotonic() > deadline:
            return frames
        time.sleep(0.5)


def test_hung_rank_stops_progress_and_py_spy_shows_where(new_job: Any) -> None:
    cluster: TorchCluster = new_job("--hang-rank=3", "--hang-at-step=5")
    cluster.wait_for_step(4, timeout=TORCH_STEPS_S)
    pids = cluster.rank_pids()

    hung = _wait_for_top_frame(pids[3], "_stuck_in_data_loading")
    assert hung[0] == ("_stuck_in_data_loading", str(TRAIN_SCRIPT)), hung
    assert hung[1][0] == "main"
    for peer in (0, 2):  # rank 0 is on the other node, rank 2 on the hung rank's own node
        waiting = _wait_for_top_frame(pids[peer], "all_reduce")
        assert waiting[0][0] == "all_reduce" and waiting[0][1].endswith("torch/distributed/distributed_c10d.py"), (
            f"rank {peer}: {waiting}"
        )
        assert "main" in [name for name, _ in waiting]

    # No rank can finish step 5 while rank 3 is stuck; everything is still alive (a hang, not a crash).
    last = cluster.last_steps()
    time.sleep(1.5)  # 10+ steps' worth at the job's pace
    assert cluster.last_steps() == last == dict.fromkeys(range(WORLD), 4)
    assert all(p.poll() is None for p in cluster.launchers)
    assert all(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids.values())


def test_crashed_rank_ends_job_with_traceback_and_child_failed_summary(new_job: Any) -> None:
    cluster: TorchCluster = new_job("--crash-rank=1", "--crash-at-step=5")

    codes = cluster.wait_exited(timeout=60)

    assert all(code != 0 for code in codes), codes
    log = cluster.log_text(0)
    # The rank's own traceback, as torchrun's tee forwards it (torch itself adds the inner [rank1]: prefix).
    assert "[rank1]:[rank1]: Traceback (most recent call last):" in log, log
    assert "[rank1]:[rank1]: RuntimeError: injected fault: rank 1 crashed at step 5" in log
    # torchrun's summary on the crashed rank's node, carrying the rank and its traceback (thanks to @record).
    summary = log.split("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", 1)
    assert len(summary) == 2, log
    assert "train.py FAILED" in summary[1]
    assert "rank      : 1 (local_rank: 1)" in summary[1]
    assert "RuntimeError: injected fault: rank 1 crashed at step 5" in summary[1]
    # The other node's ranks lose their peer in the collective and that node fails too.
    assert "Connection closed by peer" in cluster.log_text(1)
    assert "ChildFailedError" in cluster.log_text(1)
    assert max(cluster.last_steps().values()) == 4


def test_user_bug_raises_the_same_exception_on_every_rank(new_job: Any) -> None:
    cluster: TorchCluster = new_job("--user-bug-at-step=5")

    codes = cluster.wait_exited(timeout=60)

    assert all(code != 0 for code in codes), codes
    message = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x15 and 16x32)"
    for rank in range(WORLD):
        # Every rank's own traceback ends in the same exception: the signature of a bug in the code, not a machine.
        assert f"[rank{rank}]:[rank{rank}]: {message}" in cluster.log_text(rank // PROCS), cluster.logs()
    assert max(cluster.last_steps().values()) == 4


def test_real_life_behaviour_checkpoints_evaluates_stalls_and_resumes(new_job: Any, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    common = ["--step-time=0.05", "--checkpoint-every=5", "--checkpoint-seconds=1.5", f"--checkpoint-dir={ckpt}"]
    cluster: TorchCluster = new_job(
        "--steps=12",
        *common,
        "--eval-every=7",
        "--eval-iters=2",
        "--stall-every=4",
        "--stall-seconds=1",
        "--warmup-steps=5",
    )
    assert cluster.wait_exited(timeout=90) == [0] * NODES, cluster.logs()
    log = cluster.log_text(0)
    # Megatron's checkpoint lines from rank 0, and no rank steps while the state is saved.
    assert (
        "saving checkpoint at iteration       5 to" in log
        and "successfully saved checkpoint from iteration      10" in log
    )
    assert sorted(p.name for p in ckpt.glob("iter_*.pt")) == ["iter_0000005.pt", "iter_0000010.pt"]
    assert "validation loss at iteration 7 | lm loss value:" in log
    # The stall of step 8 is on rank (8 // 4) % 4 = 2: every rank's step 8 waits for it.
    assert all(s.elapsed_ms >= 900 for s in cluster.steps() if s.step == 8), cluster.logs()

    resumed: TorchCluster = new_job("--steps=13", *common, "--resume")
    assert resumed.wait_exited(timeout=90) == [0] * NODES, resumed.logs()
    # Both jobs log to the same files: what follows the load is the restarted job's.
    _, loaded, after = resumed.log_text(0).partition("successfully loaded checkpoint from")
    assert loaded and after.split("\n", 1)[0].endswith("at iteration 10"), resumed.logs()
    assert re.findall(r"^\[rank0\]:step=(\d+) ", after, re.M) == ["11", "12", "13"]  # 11 and 12 trained again
