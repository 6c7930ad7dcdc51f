"""`faultline bench ingest`: sustained agent ingest through the real HTTP API, against raw COPY.

The API (uvicorn, `--api-workers` processes) and a Celery worker run as child processes, as in
production; a separate load-generator process (lab/bench/loadgen.py) posts agent-shaped batches:
a warm-up round (each node's first batch), a paced open-loop phase (every node once per ship interval,
spread evenly; each batch carries ship/sample samples per GPU, as an agent that samples every
`--sample-interval` and ships every `--ship-interval` sends them), then a closed-loop capacity phase.
Afterwards the same metric rows are written with psycopg COPY into the same database, and the HTTP
capacity is reported as a ratio of that rate.

The backend, token and process helpers it shares with `faultline bench scale-eval` are in
lab/bench/backend.py; the targets and the report in lab/bench/ingest_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg

from lab.bench.backend import Backend, create_token, follow_load, say, start_backend, start_load, start_service
from lab.bench.baseline import run_copy
from lab.bench.busy import line_in, note, watch_other_load
from lab.bench.ingest_report import _targets, format_report
from lab.bench.loadgen_protocol import LoadConfig, samples_per_batch
from lab.bench.synthetic import FIELD_COUNT

# A full server flush (ingest_flush_max_batches): the COPY baseline commits as often as the server can.
BATCHES_PER_TRANSACTION = 256
MIN_COPY_ROWS = 65_536
NODE_PREFIX = "bench-node"


def _count_rows(dsn: str, job_name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            # Through gpu_samples: an hour beat compacted meanwhile (a run past an hour's end) still counts.
            "SELECT count(*) FROM gpu_samples('-infinity', 'infinity') "
            "WHERE job_id = (SELECT id FROM jobs WHERE external_id = %s)",
            (job_name,),
        ).fetchone()
    return int(row[0]) if row else 0


def _node_ids(dsn: str, names: list[str]) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT name, id FROM nodes WHERE name = ANY(%s)", (names,)).fetchall()
    return dict(rows)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def check_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, or None."""
    if (
        min(args.nodes, args.gpus_per_node, args.connections, args.api_workers) < 1
        or min(args.ship_interval, args.sample_interval, args.duration, args.capacity_seconds) <= 0
    ):
        return (
            "--nodes, --gpus-per-node, --connections, --api-workers, --ship-interval, --sample-interval, --duration "
            "and --capacity-seconds must be positive"
        )
    try:
        samples_per_batch(args.ship_interval, args.sample_interval)
    except ValueError as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    problem = check_arguments(args)
    if problem:
        print(f"faultline bench: {problem}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="faultline-bench-"))
    # A plain kill must stop the children too, as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    ok = False
    try:
        with contextlib.ExitStack() as stack:
            figures = _bench(args, workdir, stack)
            ok = True
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except RuntimeError as exc:
        say(f"error: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        logs = workdir / "logs"
        if ok or not (logs.is_dir() and any(logs.iterdir())):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            for data in ("postgres", "redis", "prometheus"):
                shutil.rmtree(workdir / data, ignore_errors=True)
            say(f"logs kept in {logs}")
    print(format_report(figures))
    print(line_in(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        say(f"figures written to {args.json}")
    return 0


def _bench(args: argparse.Namespace, workdir: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    from service import migrate

    backend = start_backend(args.data_dir, workdir, stack)
    say(f"database: {backend.kind}; applying migrations ...")
    migrate.upgrade(backend.database_url)
    token = create_token(stack)
    service = start_service(
        backend, workdir, stack, api_workers=args.api_workers, worker_concurrency=None if args.no_worker else 1
    )

    job_name = f"bench-{uuid.uuid4().hex[:8]}"
    config = LoadConfig(
        host="127.0.0.1",
        port=service.port,
        token=token,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        ship_interval=args.ship_interval,
        sample_interval=args.sample_interval,
        duration=args.duration,
        connections=args.connections,
        capacity_seconds=args.capacity_seconds,
        job_id=job_name,
        node_prefix=NODE_PREFIX,
    )
    say(
        f"load: {args.nodes} nodes x {args.gpus_per_node} GPUs sampled every {args.sample_interval:g} s, shipped every "
        f"{args.ship_interval:g} s, for {args.duration:g} s, then {args.capacity_seconds:g} s unpaced, over "
        f"{args.connections} connections (job {job_name})"
    )
    with watch_other_load(backend.dsn) as watched:
        load = follow_load(start_load(config, stack), service.cpu_roots)
        service.check()

        answered = sum(load[phase]["ok_samples"] for phase in ("warmup", "paced", "capacity"))
        # Requests cut off by a hung server may have been stored without an answer.
        unanswered = sum(load[phase]["unanswered"] for phase in ("warmup", "paced", "capacity")) * (
            args.gpus_per_node * samples_per_batch(args.ship_interval, args.sample_interval)
        )
        stored = _count_rows(backend.dsn, job_name)
        copy = _copy_baseline(backend.dsn, args, job_name, rows=max(answered, MIN_COPY_ROWS))
    figures = _figures(args, backend, load, copy)
    note(figures, watched)
    figures["rows"] = {
        "stored": stored,
        "ok_samples": answered,
        "unanswered_samples": unanswered,
        "match": answered <= stored <= answered + unanswered,
    }
    return figures


def _copy_baseline(dsn: str, args: argparse.Namespace, job_name: str, *, rows: int) -> dict[str, Any]:
    node_ids = _node_ids(dsn, [f"{NODE_PREFIX}-{i:04d}" for i in range(args.nodes)])
    say(f"raw COPY baseline: {rows:,} rows into metric_samples ...")
    copy = run_copy(
        dsn,
        node_ids=node_ids,
        gpus=args.gpus_per_node,
        job_name=job_name,
        prefix=NODE_PREFIX,
        rows=rows,
        # A server flush holds BATCHES_PER_TRANSACTION batches of every sample they carry.
        batches_per_transaction=BATCHES_PER_TRANSACTION * samples_per_batch(args.ship_interval, args.sample_interval),
    )
    return copy.figures()


def _figures(args: argparse.Namespace, backend: Backend, load: dict[str, Any], copy: dict[str, Any]) -> dict[str, Any]:
    paced, capacity = load["paced"], load["capacity"]
    gpus = args.nodes * args.gpus_per_node
    # What the paced phase scheduled (whole batches: a duration that is no multiple of the ship interval
    # schedules a little less than nodes x duration / ship interval).
    requests = paced["requests_scheduled"] / args.duration
    offered = requests * args.gpus_per_node * samples_per_batch(args.ship_interval, args.sample_interval)
    sustained_ratio = paced["samples_per_s"] / offered
    p99 = paced["latency_ms"]["p99"]
    kept_up = sustained_ratio >= 0.98 and p99 is not None and p99 < args.ship_interval * 1000
    ratio = capacity["samples_per_s"] / copy["rows_per_s"] if copy["rows_per_s"] else 0.0
    api_cores = load["cpu_cores"].get("paced", {}).get("api")
    return {
        "config": {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "gpus": gpus,
            "sample_interval_s": args.sample_interval,
            "ship_interval_s": args.ship_interval,
            "samples_per_batch": samples_per_batch(args.ship_interval, args.sample_interval),
            "duration_s": args.duration,
            "capacity_s": args.capacity_seconds,
            "api_workers": args.api_workers,
            "worker": not args.no_worker,
            "connections": args.connections,
            "fields_per_sample": FIELD_COUNT,
            "cpus": os.cpu_count(),
            "database": backend.kind,
        },
        "warmup": load["warmup"],
        "paced": paced
        | {
            "offered_samples_per_s": offered,
            "offered_requests_per_s": requests,
            "sustained_ratio": sustained_ratio,
            "kept_up": kept_up,
            "api_cores": api_cores,
            # Little's law: concurrent requests the offered rate needs at the measured service time
            "concurrency_needed": requests * (paced["service_ms"]["p50"] or 0) / 1000,
        },
        "capacity": capacity,
        "copy_baseline": copy,
        "ratio_capacity_to_copy": ratio,
        "cpu_cores": load["cpu_cores"],
        "targets": _targets(args, kept_up=kept_up, ratio=ratio, p99=p99, api_cores=api_cores),
    }
