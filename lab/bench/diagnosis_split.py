"""`faultline bench diagnosis --workers N`: passes of one job dispatched through Celery to N real worker processes.

Per size: the job and its history as the in-process bench makes them, then N `faultline work --queues diagnosis
--concurrency 1` processes (prefork, one child each: a process per worker as on N machines, and a child whose RSS
is the pass's), started for the size, so the first pass is a cold one after a worker (re)start. Every pass is
sent as the beat sends it (`diagnosis.diagnose_job`) and timed from sending to its end: a split pass's end is its
merge (the chord's body), so the time covers the plan, the group tasks on the workers, the result backend and the
merge. The cold pass is split; then steady passes, 5 s of signals apart, in the order single, split, split,
single, ... so each kind meets both kinds of pass (one builds the windows, the next judges them), and the two
kinds' p95 in one run give the split's ratio on this machine's load of the moment.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from lab.bench.backend import say, spawn
from ml.windows import floor_time

TIMEOUT_S = 900.0  # one pass, however loaded the machine: beyond this the run is not worth reading


def start_workers(count: int, *, gpus: int, logs: Path, stack: contextlib.ExitStack) -> list[int]:
    """N diagnosis workers splitting a job of `gpus` GPUs into N node groups; their pids once all answer."""
    from service.worker import celery_app

    env = {
        **os.environ,
        "FAULTLINE_DIAGNOSIS_SPLIT_GROUP_GPUS": str(math.ceil(gpus / count)),
        "PYTHONUNBUFFERED": "1",
    }
    logs.mkdir(parents=True, exist_ok=True)
    pids = []
    for i in range(count):
        argv = ["faultline", "work", "--queues", "diagnosis", "--concurrency", "1"]
        process = spawn([*argv], env, logs / f"worker-{gpus}-{i}.log", stack)
        pids.append(process.pid)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        replies = celery_app.control.ping(timeout=2.0) or []
        if len(replies) >= count:
            return pids
        time.sleep(1)
    raise RuntimeError(f"{count} workers did not answer within 180 s; see {logs}")


def timed_pass(job_id: str, *, now: datetime, split: bool) -> tuple[float, dict[str, Any]]:
    """One pass through Celery, from sending to its end (for a split pass: its merge), and the pass's report."""
    from service.diagnosis import tasks
    from service.worker import celery_app

    started = time.perf_counter()
    sent = tasks.diagnose_job.apply_async(
        args=[job_id], kwargs={"now": now.isoformat(), "split": split}, ignore_result=False
    )
    report = sent.get(timeout=TIMEOUT_S)
    if split:
        merged = celery_app.AsyncResult(report["merge_id"])
        report = {**report, **merged.get(timeout=TIMEOUT_S)}
        merged.forget()
    seconds = time.perf_counter() - started
    sent.forget()  # read: gone from Redis, and nothing left pending when the bench stops its Redis
    return seconds, report


def peak_rss_mb(pids: list[int]) -> float:
    """The largest peak RSS (VmHWM) of the workers' processes and their pool children."""
    from lab.bench import cpu

    stats = cpu.all_stats()
    peak = 0
    for root in pids:
        for pid in cpu.tree_pids(stats, root):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
    return peak / 1024


def run_size(gpus: int, args: argparse.Namespace, *, logs: Path, bench: ModuleType) -> dict[str, Any]:
    """Figures of one size through N workers (see the module's docstring)."""
    from service.db import session_scope

    nodes = -(-gpus // bench.GPUS_PER_NODE)
    job_id = f"bench-diag-{gpus}-{int(time.time())}"
    now = floor_time(datetime.now(UTC)) - timedelta(seconds=1)
    started = time.perf_counter()
    with session_scope() as session:
        job, node_ids = bench._create_job(session, job_id=job_id, nodes=nodes)
        if not args.every_column:
            bench._record_columns(session, job_id=job.id)
        start = now - timedelta(seconds=args.history)
        rows = bench._signals(session, job=job, node_ids=node_ids, start=start, end=now, step_streams=args.step_streams)
    say(f"{gpus} GPUs ({nodes} nodes): generated {rows:,} rows of history in {time.perf_counter() - started:.1f} s")
    with contextlib.ExitStack() as stack:
        pids = start_workers(args.workers, gpus=gpus, logs=logs, stack=stack)
        say(f"  {args.workers} workers answering")
        passes: list[dict[str, Any]] = []
        for i in range(2 * args.passes + 1):
            if i:
                now = bench._ship_tick(job=job, node_ids=node_ids, now=now, step_streams=args.step_streams)
            split = i == 0 or (i - 1) % 4 in (1, 2)  # cold split; then single, split, split, single, ...
            seconds, report = timed_pass(job_id, now=now, split=split)
            passes.append(
                {
                    "seconds": seconds,
                    "split": split,
                    "plan_s": report.get("plan_s"),
                    "groups_s": report.get("groups_s"),
                    "timings": report.get("timings", {}),
                }
            )
            kind = "cold split" if i == 0 else ("split" if split else "single")
            detail = (
                f" (plan {report['plan_s']:.2f} s, slowest group {max(report['groups_s']):.2f} s, merge "
                f"{sum(report['timings'].values()):.2f} s: {bench._stages(report['timings'])})"
                if split
                else ""
            )
            say(f"  {kind} pass {i}: {seconds:.3f} s{detail}")
        rss = peak_rss_mb(pids)
    steady = {
        kind: [p["seconds"] for p in passes[1:] if p["split"] == (kind == "split")] for kind in ("single", "split")
    }
    return {
        "gpus": gpus,
        "nodes": nodes,
        "workers": args.workers,
        "history_rows": rows,
        "cold_split_s": passes[0]["seconds"],
        **{f"{kind}_p50_s": statistics.median(v) for kind, v in steady.items()},
        **{f"{kind}_p95_s": bench._p95(v) for kind, v in steady.items()},
        "split_over_single_p95": bench._p95(steady["split"]) / bench._p95(steady["single"]),
        "merge_stage_median_s": {
            k: statistics.median(p["timings"].get(k, 0.0) for p in passes[1:] if p["split"])
            for k in sorted({k for p in passes[1:] if p["split"] for k in p["timings"]})
        },
        "worker_peak_rss_mb": rss,
        "passes": passes,
    }


def format_report(figures: dict[str, Any]) -> str:
    sizes = figures["sizes"]
    lines = [
        f"diagnosis passes through Celery, {sizes[0]['workers']} worker processes (prefork, one child each); "
        "times from sending the pass to its end (a split pass: its merge); steady passes 5 s of signals apart:",
        f"{'GPUs':>6} {'nodes':>6} {'cold split s':>12} {'single p50':>10} {'single p95':>10} {'split p50':>9} "
        f"{'split p95':>9} {'split/single':>12} {'RSS MB':>7}  merge's slowest stages (median s)",
    ]
    for s in sizes:
        stages = sorted(s["merge_stage_median_s"].items(), key=lambda kv: -kv[1])[:5]
        lines.append(
            f"{s['gpus']:>6} {s['nodes']:>6} {s['cold_split_s']:>12.2f} {s['single_p50_s']:>10.3f} "
            f"{s['single_p95_s']:>10.3f} {s['split_p50_s']:>9.3f} {s['split_p95_s']:>9.3f} "
            f"{s['split_over_single_p95']:>12.2f} {s['worker_peak_rss_mb']:>7.0f}  "
            + ", ".join(f"{k} {v:.3f}" for k, v in stages)
        )
    return "\n".join(lines)
