"""Benchmark of stack aggregation on a synthetic hung Megatron-style job (`faultline bench stacks`).

Every rank gets a py-spy-shaped dump (three threads, 25-40 frames on the main one): most ranks wait in the
data-parallel gradient all-reduce, the last pipeline stage in the loss all-reduce, the tensor-parallel peers of
the culprit in the batch broadcast, and one rank hangs in its DataLoader. Line numbers, install prefixes and
thread order vary between ranks as they do between machines, and must not split the groups.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

from lab.bench.busy import note, watch_other_load
from ml.findings import JobInfo, StackSample
from ml.stacks import analyze, findings

RANKS_PER_NODE = 8
_PREFIXES = ("/usr/local/lib/python3.10/dist-packages/", "/opt/conda/lib/python3.10/site-packages/")
_STDLIB = ("/usr/lib/python3.10/", "/opt/conda/lib/python3.10/")
_MEGATRON = "/workspace/Megatron-LM/"

# (function, file, where: "pkg" site-packages, "std" stdlib, "app" the training checkout), outermost first.
_ENTRY = [
    ("<module>", "pretrain_gpt.py", "app"),
    ("pretrain", "megatron/training/training.py", "app"),
    ("train", "megatron/training/training.py", "app"),
    ("train_step", "megatron/training/training.py", "app"),
]
_SCHEDULE = [
    ("forward_backward_pipelining_without_interleaving", "megatron/core/pipeline_parallel/schedules.py", "app"),
]
_GRAD_SYNC = [
    ("finalize_model_grads", "megatron/core/distributed/finalize_model_grads.py", "app"),
    ("finish_grad_sync", "megatron/core/distributed/distributed_data_parallel.py", "app"),
    ("finish_grad_sync", "megatron/core/distributed/param_and_grad_buffer.py", "app"),
    ("start_grad_sync", "megatron/core/distributed/param_and_grad_buffer.py", "app"),
    ("decorate_context", "torch/utils/_contextlib.py", "pkg"),
    ("wrapper", "torch/distributed/c10d_logger.py", "pkg"),
    ("all_reduce", "torch/distributed/distributed_c10d.py", "pkg"),
]
_LOSS_SYNC = [
    ("forward_step", "megatron/core/pipeline_parallel/schedules.py", "app"),
    ("loss_func", "pretrain_gpt.py", "app"),
    ("average_losses_across_data_parallel_group", "megatron/training/utils.py", "app"),
    ("wrapper", "torch/distributed/c10d_logger.py", "pkg"),
    ("all_reduce", "torch/distributed/distributed_c10d.py", "pkg"),
]
_BATCH = [
    ("forward_step", "megatron/core/pipeline_parallel/schedules.py", "app"),
    ("forward_step", "pretrain_gpt.py", "app"),
    ("get_batch", "pretrain_gpt.py", "app"),
    ("get_batch_on_this_tp_rank", "megatron/training/utils.py", "app"),
]
_TP_BROADCAST = [
    ("_broadcast", "megatron/training/utils.py", "app"),
    ("wrapper", "torch/distributed/c10d_logger.py", "pkg"),
    ("broadcast", "torch/distributed/distributed_c10d.py", "pkg"),
]
_DATALOADER = [
    ("__next__", "torch/utils/data/dataloader.py", "pkg"),
    ("_next_data", "torch/utils/data/dataloader.py", "pkg"),
    ("_get_data", "torch/utils/data/dataloader.py", "pkg"),
    ("_try_get_data", "torch/utils/data/dataloader.py", "pkg"),
    ("get", "multiprocessing/queues.py", "std"),
    ("poll", "multiprocessing/connection.py", "std"),
    ("_poll", "multiprocessing/connection.py", "std"),
    ("wait", "multiprocessing/connection.py", "std"),
    ("select", "selectors.py", "std"),
]
# Wrappers a real stack carries between the entry point and the schedule (autocast, profilers, decorators).
_WRAPPERS = [
    ("wrapper", "torch/distributed/elastic/multiprocessing/errors/__init__.py", "pkg"),
    ("main", "pretrain_gpt.py", "app"),
    ("inner", "contextlib.py", "std"),
    ("decorate_context", "torch/utils/_contextlib.py", "pkg"),
    ("__call__", "megatron/core/utils.py", "app"),
    ("<lambda>", "megatron/core/utils.py", "app"),
    ("wrapped_fn", "megatron/training/utils.py", "app"),
    ("inner", "contextlib.py", "std"),
    ("_fn", "torch/_dynamo/eval_frame.py", "pkg"),
    ("wrapper", "megatron/core/timers.py", "app"),
    ("train_step_inner", "megatron/training/training.py", "app"),
    ("_run", "megatron/core/pipeline_parallel/schedules.py", "app"),
    ("__exit__", "contextlib.py", "std"),
    ("run_with_profiler", "megatron/training/training.py", "app"),
    ("record_function_wrapper", "torch/autograd/profiler.py", "pkg"),
    ("nvtx_range", "megatron/core/utils.py", "app"),
    ("inner", "contextlib.py", "std"),
    ("wrapper", "megatron/training/utils.py", "app"),
    ("_wrapped", "megatron/core/rerun_state_machine.py", "app"),
    ("should_run", "megatron/core/rerun_state_machine.py", "app"),
]
_OTHER_THREADS = [
    ("Thread-1 (_pin_memory_loop)", [("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py", "pkg")]),
    ("Thread-2 (_check_health)", [("run", "threading.py", "std"), ("_check_health", "megatron/core/utils.py", "app")]),
]


def _frames(spec: list[tuple[str, str, str]], *, node: int, rng: random.Random, jitter: bool) -> list[dict[str, Any]]:
    """py-spy frames, innermost first, with this machine's install prefix and (maybe) shifted line numbers."""
    prefix, stdlib = _PREFIXES[node % 2], _STDLIB[node % 2]
    out = []
    for i, (name, path, where) in enumerate(reversed(spec)):
        root = prefix if where == "pkg" else stdlib if where == "std" else _MEGATRON
        line = 100 + 7 * i + (rng.randrange(1, 40) if jitter else 0)
        out.append(
            {
                "name": name,
                "filename": root + path,
                "module": None,
                "short_filename": path,
                "line": line,
                "locals": None,
                "is_entry": i == len(spec) - 1,
            }
        )
    return out


def _threads(main: list[dict[str, Any]], *, rank: int, node: int, rng: random.Random) -> list[dict[str, Any]]:
    base = 140_000_000_000_000 + rank * 4096
    threads = [
        {"pid": 1000 + rank, "thread_id": base, "thread_name": "MainThread", "os_thread_id": 1000 + rank,
         "active": False, "owns_gil": False, "frames": main}
    ]  # fmt: skip
    for k, (name, spec) in enumerate(_OTHER_THREADS, start=1):
        frames = _frames(spec, node=node, rng=rng, jitter=False)
        threads.append(
            {"pid": 1000 + rank, "thread_id": base + k, "thread_name": name, "os_thread_id": 5000 + rank * 4 + k,
             "active": False, "owns_gil": False, "frames": frames}
        )  # fmt: skip
    if rank % 3 == 0:  # py-spy does not promise the main thread first
        threads.reverse()
    return threads


def synthetic_hang(
    ranks: int, *, tp: int = 8, pp: int = 8, seed: int = 0
) -> tuple[JobInfo, list[StackSample], int, str]:
    """(job, one dump per rank, culprit rank, culprit's node) of a job hung by one rank's DataLoader."""
    rng = random.Random(seed)
    job = JobInfo(
        job_id="bench-stacks",
        world_size=ranks,
        tp=tp,
        pp=pp,
        rank_nodes={r: f"node-{r // RANKS_PER_NODE:04d}" for r in range(ranks)},
    )
    stride_pp = ranks // pp if pp > 1 else ranks
    # The culprit loads data for its TP group (TP rank 0), on a stage that is not the last.
    culprit = rng.randrange(0, max(1, stride_pp * max(1, pp - 1)) // tp) * tp
    samples = []
    for rank in range(ranks):
        node = rank // RANKS_PER_NODE
        stage = rank // stride_pp if pp > 1 else 0
        wrappers = _WRAPPERS[: 16 + (node % 5)]  # different depths per machine: more distinct signatures
        head = _ENTRY[:1] + wrappers + _ENTRY[1:] + _SCHEDULE
        if rank == culprit:
            spec = head + _BATCH + _DATALOADER
        elif rank // tp == culprit // tp and tp > 1:
            spec = head + _BATCH + _TP_BROADCAST
        elif stage == pp - 1 and pp > 1:
            spec = head + _LOSS_SYNC
        else:
            spec = head + _GRAD_SYNC
        frames = _frames(spec, node=node, rng=rng, jitter=rng.random() < 0.3)
        threads = _threads(frames, rank=rank, node=node, rng=rng)
        samples.append(StackSample(rank=rank, node=job.rank_nodes[rank], pid=1000 + rank, threads=threads, id=rank))
    return job, samples, culprit, job.rank_nodes[culprit]


def main(argv: list[str] | None = None) -> int:
    """Time analyze() on a synthetic hung job; 0 when it names the culprit's machine."""
    parser = argparse.ArgumentParser(prog="faultline bench stacks", description=__doc__)
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.ranks % (args.tp * args.pp):
        print(f"--ranks must be a multiple of tp*pp = {args.tp * args.pp}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    job, samples, culprit, node = synthetic_hang(args.ranks, tp=args.tp, pp=args.pp, seed=args.seed)
    generated = time.perf_counter() - started
    frames = [len(s.threads[0 if s.rank % 3 else -1]["frames"]) for s in samples]
    timings = []
    analysis = None
    with watch_other_load() as watched:
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            analysis = analyze(job, samples)
            timings.append(time.perf_counter() - t0)
    assert analysis is not None
    t0 = time.perf_counter()
    found = findings(job, analysis, observed_at=datetime.now(UTC))
    findings_s = time.perf_counter() - t0
    print(
        f"stacks: {args.ranks} ranks (tp={args.tp} pp={args.pp}), {min(frames)}-{max(frames)} frames per main thread,"
        f" {len(analysis.groups)} signatures; data generated in {generated:.2f} s"
    )
    print(
        f"analyze: min {min(timings) * 1000:.1f} ms, median {statistics.median(timings) * 1000:.1f} ms"
        f" over {len(timings)} runs; findings: {findings_s * 1000:.1f} ms"
    )
    named = [s[0] for s in analysis.suspects]
    print(f"located: method={analysis.method} suspects={named[:5]} culprit ranks={analysis.culprit_ranks[:8]}")
    print(f"expected: rank {culprit} on {node}; {len(found)} finding(s)")
    ok = analysis.method == "named" and named == [node]
    print("result: " + ("found the culprit's machine" if ok else "MISSED the culprit's machine"))
    print(note({}, watched))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
