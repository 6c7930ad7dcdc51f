"""`faultline bench diagnosis`: time diagnosis passes of one job at several sizes, as a worker runs them.

For each size, a job of `--gpus` GPUs (8 per node, one rank per GPU) gets `--history` seconds of healthy
signals generated inside PostgreSQL (one metric sample per GPU per second with ~20 DCGM fields and one slow
GPU, a step line per node per second, a process snapshot per rank every 5 s, and every 5 s each node's 8 IB
ports and its host, one port congested). Then a cold pass (no detector
state: it builds the lookback's windows from raw samples, as after an outage of the workers longer than the
lookback) and `--passes` steady passes, each after 5 more seconds of signals, as the beat's 5 s cadence sees them;
then the first pass after a worker restart (lab/bench/diagnosis_restart.py: a fresh process, the windows and
detector state stored by the passes before). Prints per-pass time (p50, p95, max), seconds per stage and the peak
RSS of the process that ran the passes (the worker's role), size by size so the growth is visible.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from lab.bench.backend import say, start_backend
from lab.bench.busy import note, watch_other_load
from ml.windows import floor_time

GPUS_PER_NODE = 8
SHIP_S = 5  # agents ship every 5 s: each steady pass sees 5 more seconds of everything
TARGET_P95_S = {1024: 0.3, 16384: 2.0}
TARGET_RESTART_S = {16384: 5.0}  # the first pass after a worker restart (issue 44)
TARGET_RSS_MB = 2048


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline bench diagnosis", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gpus", default="1024,4096,16384", help="job sizes to time, comma-separated (default %(default)s)"
    )
    parser.add_argument("--passes", type=int, default=12, help="steady passes per size (default %(default)s)")
    parser.add_argument("--history", type=int, default=330, help="seconds of signals before the first pass")
    parser.add_argument(
        "--step-streams",
        type=int,
        default=8,
        help="ranks that log step lines, spread over the nodes (default %(default)s: trainers such as Megatron log "
        "from one rank or one per pipeline stage; give the node count for a step line per node)",
    )
    parser.add_argument(
        "--every-column",
        action="store_true",
        help="record no reported columns for the job, so windows roll up every metric column (as for rows that "
        "did not come through ingest); by default the generated columns are recorded, as ingest records an "
        "agent's",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="send the passes through Celery to this many worker processes started for each size, split passes "
        "against single ones (lab/bench/diagnosis_split.py); 0 (default): passes run in this process",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--data-dir", type=Path, help="embedded PostgreSQL and Redis there (default: a temp dir)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        sizes = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        say(f"--gpus takes whole numbers separated by commas, not {args.gpus!r}")
        return 2
    if not sizes or min(sizes) < GPUS_PER_NODE or args.passes < 1 or args.history < 60 or args.workers < 0:
        say(f"--gpus must be at least {GPUS_PER_NODE}, --passes at least 1, --history at least 60, --workers >= 0")
        return 2
    from service import migrate

    with contextlib.ExitStack() as stack:
        backend = start_backend(args.data_dir, Path(tempfile.mkdtemp(prefix="faultline-bench-diag-")), stack)
        os.environ["FAULTLINE_DATABASE_URL"] = backend.database_url
        os.environ["FAULTLINE_REDIS_URL"] = backend.redis_url
        say(f"database: {backend.kind}; applying migrations ...")
        migrate.upgrade(backend.database_url)
        columns = "every metric column" if args.every_column else "the generated (reported) columns"
        with watch_other_load(backend.dsn) as watched:
            if args.workers:
                from lab.bench import diagnosis_split

                logs = Path(tempfile.mkdtemp(prefix="faultline-bench-diag-workers-"))
                # The in-process bench's job and history builders, handed over (lab.bench is kept free of cycles).
                here = sys.modules[__name__]
                runs = [diagnosis_split.run_size(gpus, args, logs=logs, bench=here) for gpus in sizes]
                figures = {"columns": columns, "sizes": runs}
            else:
                figures = {"columns": columns, "sizes": [_size(gpus, args) for gpus in sizes]}
    if args.workers:
        print(diagnosis_split.format_report(figures))
    else:
        print(format_report(figures))
    print(note(figures, watched))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        say(f"figures written to {args.json}")
    return 0


def _size(gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    from service.config import get_settings
    from service.db import session_scope
    from service.diagnosis import service

    settings = get_settings()
    nodes = -(-gpus // GPUS_PER_NODE)
    job_id = f"bench-diag-{gpus}-{int(time.time())}"
    now = floor_time(datetime.now(UTC)) - timedelta(seconds=1)
    started = time.perf_counter()
    with session_scope() as session:
        job, node_ids = _create_job(session, job_id=job_id, nodes=nodes)
        if not args.every_column:
            _record_columns(session, job_id=job.id)
        start = now - timedelta(seconds=args.history)
        rows = _signals(session, job=job, node_ids=node_ids, start=start, end=now, step_streams=args.step_streams)
    say(f"{gpus} GPUs ({nodes} nodes): generated {rows:,} rows of history in {time.perf_counter() - started:.1f} s")
    passes: list[dict[str, Any]] = []
    for i in range(args.passes + 1):
        if i:
            now = _ship_tick(job=job, node_ids=node_ids, now=now, step_streams=args.step_streams)
        gc.collect()
        t0 = time.perf_counter()
        with session_scope() as session:
            result = service.diagnose_job(session, job_id=job_id, settings=settings, now=now)
        seconds = time.perf_counter() - t0
        passes.append({"seconds": seconds, "timings": result.timings, "findings": result.new_findings})
        say(f"  {'cold' if i == 0 else f'pass {i}'}: {seconds:.3f} s ({_stages(result.timings)})")
    now = _ship_tick(job=job, node_ids=node_ids, now=now, step_streams=args.step_streams)
    restart = _restart_pass(job_id, now=now)
    say(
        f"  after a worker restart: {restart['seconds']:.3f} s (the process's start {restart['startup_s']:.1f} s "
        f"before it; {_stages(restart['timings'])})"
    )
    steady = [p["seconds"] for p in passes[1:]]
    stages = sorted({k for p in passes[1:] for k in p["timings"]})
    return {
        "gpus": gpus,
        "nodes": nodes,
        "history_s": args.history,
        "history_rows": rows,
        "step_streams": min(args.step_streams, nodes),
        "cold_s": passes[0]["seconds"],
        "restart_s": restart["seconds"],
        "restart_timings": restart["timings"],
        "target_restart_s": TARGET_RESTART_S.get(gpus),
        "p50_s": statistics.median(steady),
        "p95_s": _p95(steady),
        "max_s": max(steady),
        "stage_median_s": {k: statistics.median(p["timings"].get(k, 0.0) for p in passes[1:]) for k in stages},
        "findings": sum(p["findings"] for p in passes),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "target_p95_s": TARGET_P95_S.get(gpus),
    }


def _restart_pass(job_id: str, *, now: datetime) -> dict[str, Any]:
    """The first pass of a freshly started process (lab/bench/diagnosis_restart.py), on this process's database."""
    argv = [sys.executable, "-m", "lab.bench.diagnosis_restart", job_id, now.isoformat()]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy(), check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the restarted pass failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _stages(timings: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in sorted(timings.items(), key=lambda kv: -kv[1]) if v >= 0.001)


def _create_job(session: Session, *, job_id: str, nodes: int) -> tuple[Any, list[int]]:
    """The job, its nodes and its ranks (rank r on node r // 8, GPU r % 8), by set-returning SQL."""
    from service.models import Job

    prefix = job_id.replace("bench-diag-", "bd")
    node_ids = list(
        session.scalars(
            text(
                "INSERT INTO nodes (name) SELECT :p || '-' || lpad(i::text, 5, '0') FROM generate_series(0, :n - 1) i "
                "ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING id"
            ),
            {"p": prefix, "n": nodes},
        )
    )
    node_ids.sort()
    job = Job(
        external_id=job_id,
        world_size=nodes * GPUS_PER_NODE,
        tp=8,
        pp=1,
        dp=nodes,
        hang_timeout_s=300,
        source="registered",
    )
    job.state = "running"
    job.last_seen_at = datetime.now(UTC)
    session.add(job)
    session.flush()
    session.execute(
        text(
            "INSERT INTO ranks (job_id, rank, node_id, local_rank) "
            "SELECT :job, r, (:nodes)[r / 8 + 1], r % 8 FROM generate_series(0, :world - 1) r"
        ),
        {"job": job.id, "nodes": node_ids, "world": nodes * GPUS_PER_NODE},
    )
    return job, node_ids


# Healthy, correlated counters with a compute/all-reduce rhythm and per-GPU noise; GPU 3 of the first node
# runs thermally throttled (lower clock, power and activity), so the peer comparison has something to find.
_METRICS = """
INSERT INTO metric_samples (ts, node_id, gpu, job_id, gpu_util, mem_copy_util, sm_clock, mem_clock, gpu_temp,
    memory_temp, power_usage, power_limit, fb_free, fb_used, xid_last, gr_engine_active, sm_active, sm_occupancy,
    tensor_active, dram_active, total_energy, pcie_replay, ecc_sbe_volatile, ecc_dbe_volatile,
    nvlink_crc_flit_errors, nvlink_replay_errors, pcie_tx_bytes, pcie_rx_bytes, nvlink_tx_bytes, nvlink_rx_bytes)
SELECT ts, node_id, gpu, :job,
    92 + 6 * random(), 35 + 10 * random(), clock, 2619, 62 + 6 * random() + 8 * slow, 70 + 5 * random(),
    busy * 640 * (1 - 0.35 * slow) + 60 + 15 * random(), 700, 20000, 60000, 0,
    busy * 0.85 * (1 - 0.3 * slow), busy * 0.8 * (1 - 0.3 * slow), 0.45 + 0.05 * random(),
    busy * 0.55 * (1 - 0.35 * slow), 0.4 + 0.05 * random(), epoch * 600.0, 3, 0, 0, 0, 0,
    2e9 * random(), 2e9 * random(), busy * 4e10 * (1 - 0.2 * slow), busy * 4e10 * (1 - 0.2 * slow)
FROM (
    SELECT t.ts, n.node_id, g.gpu, extract(epoch FROM t.ts) AS epoch,
        CASE WHEN n.node_id = :slow_node AND g.gpu = 3 THEN 1 ELSE 0 END AS slow,
        0.85 + 0.15 * sin(extract(epoch FROM t.ts) / 2.0) + 0.02 * random() AS busy,
        CASE WHEN n.node_id = :slow_node AND g.gpu = 3 THEN 1410 ELSE 1980 END - 15 * random() AS clock
    FROM generate_series(:start, :end - interval '1 second', interval '1 second') t(ts)
    CROSS JOIN unnest(CAST(:nodes AS bigint[])) n(node_id)
    CROSS JOIN generate_series(0, 7) g(gpu)
) s
"""
_STEPS = """
INSERT INTO log_events (batch_id, node_id, job_id, ts, source, kind, severity, rank, line, fields)
SELECT gen_random_uuid(), n.node_id, :job, t.ts, 'training', 'step', 'info', n.i * 8,
    'iteration ' || s || ' | elapsed time per iteration (ms): 1000.0 | lm loss: 2.5',
    jsonb_build_object('step', s, 'elapsed_ms', 1000.0, 'loss', 2.5)
FROM generate_series(:start, :end - interval '1 second', interval '1 second') t(ts)
CROSS JOIN LATERAL (SELECT extract(epoch FROM t.ts)::bigint AS s) st
CROSS JOIN unnest(CAST(:nodes AS bigint[])) WITH ORDINALITY n(node_id, i)
WHERE (n.i - 1) % :stride = 0
"""
# Machine-level readings every 5 s: each node's 8 InfiniBand ports and its host; the first node's mlx5_5 port
# waits to send at 100x its peers' rate (congestion), so the node-signal pass has a machine to read in full.
_NODE_SIGNALS = """
INSERT INTO node_samples (ts, node_id, job_id, subject, port_state, port_phys_state, port_rate_gbps, link_downed,
    symbol_error, port_rcv_errors, port_xmit_discards, port_xmit_wait, port_rcv_bytes, port_xmit_bytes,
    cpu_util_pct, load1, mem_total_mib, mem_available_mib, psi_mem_some_avg10, psi_mem_full_avg10)
SELECT t.ts, n.node_id, :job, 'ib:mlx5_' || p || '/1', 4, 5, 400, 0, 0, 0, 0,
    (epoch * 2000 + 2000 * random()) * CASE WHEN n.node_id = :slow_node AND p = 5 THEN 100 ELSE 1 END,
    epoch * 4e10, epoch * 4e10, NULL, NULL, NULL, NULL, NULL, NULL
FROM generate_series(:start, :end - interval '1 second', interval '5 seconds') t(ts)
CROSS JOIN LATERAL (SELECT extract(epoch FROM t.ts) - 1.7e9 AS epoch) e
CROSS JOIN unnest(CAST(:nodes AS bigint[])) n(node_id)
CROSS JOIN generate_series(0, 7) p
UNION ALL
SELECT t.ts, n.node_id, :job, 'host', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    40 + 5 * random(), 60 + 5 * random(), 2e6, 1.5e6 * (0.95 + 0.1 * random()), 0.3 * random(), 0
FROM generate_series(:start, :end - interval '1 second', interval '5 seconds') t(ts)
CROSS JOIN unnest(CAST(:nodes AS bigint[])) n(node_id)
"""
_PROCESSES = """
INSERT INTO process_snapshots (batch_id, node_id, job_id, ts, pid, rank, local_rank, cpu_pct, rss_bytes, state)
SELECT gen_random_uuid(), (CAST(:nodes AS bigint[]))[r / 8 + 1], :job, t.ts, 10000 + r, r, r % 8,
    95 + 10 * random(), 8000000000, 'R'
FROM generate_series(:start, :end - interval '1 second', interval '1 second') t(ts)
CROSS JOIN generate_series(0, :world - 1) r
WHERE extract(epoch FROM t.ts)::bigint % 5 = 0
"""


def _record_columns(session: Session, *, job_id: int) -> None:
    """job_columns for the columns generated below, as ingest records those of the agents' batches."""
    for source, sql in (("gpu", _METRICS), ("node", _NODE_SIGNALS)):
        listed = sql.split("(", 1)[1].split(")", 1)[0]
        columns = [name.strip() for name in listed.split(",")][4:]  # after ts, node_id and the job and unit keys
        session.execute(
            text("INSERT INTO job_columns (job_id, source, name) SELECT :job, :source, unnest(CAST(:names AS text[]))"),
            {"job": job_id, "source": source, "names": columns},
        )


def _ship_tick(*, job: Any, node_ids: list[int], now: datetime, step_streams: int) -> datetime:
    """SHIP_S more seconds of the job's signals after `now`, as the agents' next batches bring them; the new now."""
    from service.db import session_scope

    end = now + timedelta(seconds=SHIP_S)
    with session_scope() as session:
        _signals(session, job=job, node_ids=node_ids, start=now, end=end, step_streams=step_streams)
    return end


def _signals(
    session: Session, *, job: Any, node_ids: list[int], start: datetime, end: datetime, step_streams: int
) -> int:
    """The job's signals for [start, end): metric samples, step lines, process snapshots; rows written."""
    world = len(node_ids) * GPUS_PER_NODE
    stride = max(1, len(node_ids) // max(1, step_streams))
    params = {"job": job.id, "nodes": node_ids, "start": start, "end": end, "world": world, "stride": stride}
    rows = session.execute(text(_METRICS), {**params, "slow_node": node_ids[0]}).rowcount
    rows += session.execute(text(_STEPS), params).rowcount
    rows += session.execute(text(_PROCESSES), params).rowcount
    rows += session.execute(text(_NODE_SIGNALS), {**params, "slow_node": node_ids[0]}).rowcount
    return rows


def format_report(figures: dict[str, Any]) -> str:
    lines = [
        "diagnosis passes of one job (every detector; 1 s GPU samples, a process snapshot per rank every 5 s, "
        "8 IB ports and the host per node every 5 s, "
        f"{figures['sizes'][0]['step_streams']} step-logging ranks; windows of {figures['columns']}; steady passes "
        "5 s apart; cold: the lookback's windows built from raw samples; restart: a fresh process's first pass; "
        "this machine):",
        f"{'GPUs':>6} {'nodes':>6} {'cold s':>7} {'restart s':>9} {'p50 s':>6} {'p95 s':>6} {'max s':>6} "
        f"{'target':>7} {'RSS MB':>7}  slowest stages (median s)",
    ]
    for s in figures["sizes"]:
        target = s["target_p95_s"]
        verdict = "" if target is None else ("PASS" if s["p95_s"] < target else "FAIL")
        if s["target_restart_s"] is not None:
            ok = s["restart_s"] < s["target_restart_s"]
            verdict += f" restart <{s['target_restart_s']:g} s: {'PASS' if ok else 'FAIL'}"
        stages = sorted(s["stage_median_s"].items(), key=lambda kv: -kv[1])[:5]
        lines.append(
            f"{s['gpus']:>6} {s['nodes']:>6} {s['cold_s']:>7.2f} {s['restart_s']:>9.2f} {s['p50_s']:>6.3f} "
            f"{s['p95_s']:>6.3f} "
            f"{s['max_s']:>6.3f} {('<' + str(target)) if target else '-':>7} {s['peak_rss_mb']:>7.0f}  "
            + ", ".join(f"{k} {v:.3f}" for k, v in stages)
            + (f"  {verdict}" if verdict else "")
        )
    biggest = max(figures["sizes"], key=lambda s: s["gpus"])
    lines.append(
        f"peak RSS {biggest['peak_rss_mb']:.0f} MB (target < {TARGET_RSS_MB} MB): "
        + ("PASS" if biggest["peak_rss_mb"] < TARGET_RSS_MB else "FAIL")
    )
    return "\n".join(lines)
