"""`faultline bench ingest`: sustained agent ingest through the real HTTP API, against raw COPY.

The API (uvicorn, `--api-workers` processes) and a Celery worker run as child processes, as in
production; a separate load-generator process (service/bench/loadgen.py) posts agent-shaped batches:
a warm-up round (each node's first batch), a paced open-loop phase (every node once per ship interval,
spread evenly; each batch carries ship/sample samples per GPU, as an agent that samples every
`--sample-interval` and ships every `--ship-interval` sends them), then a closed-loop capacity phase.
Afterwards the same metric rows are written with psycopg COPY into the same database, and the HTTP
capacity is reported as a ratio of that rate.

The backend, token and process helpers here are shared with `faultline bench scale-eval`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pydantic import ValidationError

from service import processes
from service.bench import cpu
from service.bench.baseline import run_copy
from service.bench.loadgen import LoadConfig, config_json, samples_per_batch
from service.config import get_settings, to_libpq_url
from service.synthetic import FIELD_COUNT

# A full server flush (ingest_flush_max_batches): the COPY baseline commits as often as the server can.
BATCHES_PER_TRANSACTION = 256
MIN_COPY_ROWS = 65_536
NODE_PREFIX = "bench-node"
TARGET_GPUS = 16_384
TARGET_FIELDS = 20
TARGET_RATIO = 0.5
# Issue 13: a 16,384-GPU job at 1 s resolution, shipped every 5 s, on little more than one API core.
TARGET_API_CORES = 1.2
TARGET_P99_MS = 250.0
TARGET_SHIP_S = 5.0  # the agent's default shipping interval


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass
class Backend:
    """Where the data goes, and what the child processes need to find it."""

    database_url: str
    redis_url: str
    kind: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        return to_libpq_url(self.database_url)


def start_backend(data_dir: Path | None, workdir: Path, stack: contextlib.ExitStack) -> Backend:
    """--data-dir wins over the environment, as for every other command; with neither, a throwaway
    embedded PostgreSQL and Redis in `workdir`."""
    from service import embedded

    if data_dir is None and os.environ.get("FAULTLINE_DATABASE_URL"):
        try:
            settings = get_settings()
        except ValidationError:
            raise SystemExit("faultline bench: set FAULTLINE_REDIS_URL too, or neither of the two") from None
        return Backend(settings.sqlalchemy_url, settings.broker_url, "external")
    folder = data_dir.resolve() if data_dir else workdir
    say(f"starting embedded PostgreSQL in {folder} ...")
    pg = embedded.use_data_dir(folder) if data_dir else embedded.start_postgres(folder)
    stack.callback(pg.stop)
    redis_url = embedded.running_redis(folder)
    if redis_url is None:
        redis = embedded.start_redis(folder)
        stack.callback(redis.stop)
        redis_url = redis.url
    os.environ.update(FAULTLINE_DATABASE_URL=pg.url, FAULTLINE_REDIS_URL=redis_url, FAULTLINE_EMBEDDED="1")
    get_settings.cache_clear()
    kind = f"embedded ({folder})" if data_dir else "embedded (temporary)"
    return Backend(get_settings().sqlalchemy_url, redis_url, kind, {"FAULTLINE_EMBEDDED": "1"})


def create_token(stack: contextlib.ExitStack, *, scope: str = "agent", name: str = "bench-ingest") -> str:
    """A token for the run, revoked when `stack` closes."""
    from service.db import session_scope
    from service.tokens import service as tokens

    with session_scope() as session:
        new = tokens.create(session, scope=scope, name=name)
        token_id = new.record.id

    def revoke() -> None:
        with session_scope() as session:
            tokens.revoke(session, token_id=token_id)

    stack.callback(revoke)
    return new.token


def spawn(argv: list[str], env: dict[str, str], log: Path, stack: contextlib.ExitStack) -> subprocess.Popen[bytes]:
    process = processes.spawn(argv, env=env, log=log)
    stack.callback(processes.stop, process)
    return process


def postmaster_pid(dsn: str) -> int | None:
    """The local PostgreSQL server's pid, to measure its CPU; None when it runs elsewhere."""
    with psycopg.connect(dsn) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
    parent = cpu.parent_pid(backend[0]) if backend else None
    if parent is None or not cpu.command_name(parent).startswith("postgres"):
        return None
    return parent


@dataclass
class Service:
    """The service's processes of a benchmark run: where the API listens, their environment and logs, and the
    process trees whose CPU is measured."""

    port: int
    env: dict[str, str]
    logs: Path
    children: dict[str, subprocess.Popen[bytes]]
    cpu_roots: dict[str, int]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check(self) -> None:
        """Raise if a process of the service has exited: every figure after that would be wrong."""
        for name, child in self.children.items():
            if child.poll() is not None:
                raise RuntimeError(
                    f"the {name} exited (code {child.returncode}) during the run; see {self.logs}/{name}.log"
                )


def start_service(
    backend: Backend,
    workdir: Path,
    stack: contextlib.ExitStack,
    *,
    api_workers: int,
    worker_concurrency: int | None,
    beat: bool = False,
    log_level: str = "WARNING",
) -> Service:
    """The API (`faultline serve`), a Celery worker unless `worker_concurrency` is None, and beat if asked,
    as child processes stopped with `stack`; returns once the API answers."""
    from service import embedded

    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    (workdir / "prometheus").mkdir(exist_ok=True)
    port = embedded.free_port()
    env = {
        **os.environ,
        **backend.env,
        "FAULTLINE_DATABASE_URL": backend.database_url,
        "FAULTLINE_REDIS_URL": backend.redis_url,
        "FAULTLINE_LOG_LEVEL": os.environ.get("FAULTLINE_LOG_LEVEL", log_level),
        "PROMETHEUS_MULTIPROC_DIR": str(workdir / "prometheus"),
        # beat keeps its schedule file in the temporary folder: the run's own, not one shared with other runs
        "TMPDIR": str(workdir),
    }
    commands = {"api": ["faultline", "serve", "--port", str(port), "--workers", str(api_workers)]}
    if worker_concurrency is not None:
        commands["worker"] = ["faultline", "work", "--concurrency", str(worker_concurrency)]
    if beat:
        commands["beat"] = ["faultline", "work", "--beat-only"]
    children = {name: spawn(argv, env, logs / f"{name}.log", stack) for name, argv in commands.items()}
    roots = {name: child.pid for name, child in children.items()}
    postmaster = postmaster_pid(backend.dsn)
    if postmaster is not None:
        roots["postgres"] = postmaster
    say(f"starting {', '.join(children)} (API: {api_workers} processes on port {port})")
    processes.wait_healthy(f"http://127.0.0.1:{port}", children["api"], log=logs / "api.log")
    return Service(port, env, logs, children, roots)


def start_load(config: LoadConfig, stack: contextlib.ExitStack) -> subprocess.Popen[str]:
    """The load generator process, given its configuration; stopped with `stack`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "service.bench.loadgen"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    stack.callback(processes.stop, process)
    assert process.stdin is not None
    process.stdin.write(config_json(config))
    process.stdin.close()
    return process


def follow_load(
    process: subprocess.Popen[str],
    cpu_roots: dict[str, int],
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Read the load generator's events to its end (each passed to `on_event`), measuring the cores each
    process tree uses in each phase; its result, with those figures under "cpu_cores"."""
    assert process.stdout is not None
    meter = cpu.CpuMeter({**cpu_roots, "load generator": process.pid})
    cores: dict[str, dict[str, float]] = {}
    result: dict[str, Any] | None = None
    for line in process.stdout:
        message = json.loads(line)
        event = message.get("event", "")
        if event.endswith("_start"):
            meter.start(time.monotonic())
        elif event.endswith("_end"):
            cores[event.removesuffix("_end")] = meter.stop(time.monotonic())
        elif "result" in message:
            result = message["result"]
        if on_event is not None and event:
            on_event(message)
    if process.wait() != 0 or result is None:
        raise RuntimeError(f"the load generator failed (exit code {process.returncode})")
    result["cpu_cores"] = cores
    return result


def _count_rows(dsn: str, job_name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM metric_samples WHERE job_id = (SELECT id FROM jobs WHERE external_id = %s)",
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


def _targets(
    args: argparse.Namespace, *, kept_up: bool, ratio: float, p99: float | None, api_cores: float | None
) -> dict[str, Any]:
    """Each target with its verdict; none is judged below the target load: 16,384 GPUs sampled at 1 s, shipped
    at least as often as the agent ships (every TARGET_SHIP_S)."""
    size = (
        args.nodes * args.gpus_per_node >= TARGET_GPUS
        and args.sample_interval <= 1.0
        and args.ship_interval <= TARGET_SHIP_S
    )
    checks = {
        "kept_up": kept_up and FIELD_COUNT >= TARGET_FIELDS and not args.no_worker,
        "copy_ratio": ratio >= TARGET_RATIO,
        "p99_ms": p99 is not None and p99 < TARGET_P99_MS,
        "api_cores": api_cores is not None and api_cores < TARGET_API_CORES,
    }
    return {"gpus": TARGET_GPUS, "size_reached": size, "checks": checks, "met": size and all(checks.values())}


def _ms(latency: dict[str, float | None]) -> str:
    return "  ".join(f"{k} {v:,.1f} ms" if v is not None else f"{k} -" for k, v in latency.items())


def format_cores(cores: dict[str, float]) -> str:
    """Cores per process tree, and what the rest of the machine used."""
    named = {name: value for name, value in cores.items() if name != "machine"}
    text = "  ".join(f"{name} {value:.2f}" for name, value in named.items())
    if "machine" in cores:
        # CPU used by processes outside the benchmark (or by ones it cannot see) skews every figure.
        other = max(0.0, cores["machine"] - sum(named.values()))
        text += f"  other {other:.2f}  (machine {cores['machine']:.2f} of {os.cpu_count()})"
    return text


def _failures(phase: dict[str, Any]) -> str:
    text = f"non-2xx {phase['non_2xx']:,}  errors {phase['errors']:,}"
    if phase.get("unsent"):
        text += f"  dropped unsent {phase['unsent']:,}"
    if phase.get("unanswered"):
        text += f"  unanswered {phase['unanswered']:,}"
    return text


def _verdict(ok: bool, size_reached: bool) -> str:
    if not size_reached:
        return "n/a"
    return "PASS" if ok else "FAIL"


def format_report(f: dict[str, Any]) -> str:
    c, paced, cap, rows = f["config"], f["paced"], f["capacity"], f["rows"]
    lines = [
        "",
        f"faultline bench ingest: {c['nodes']:,} nodes x {c['gpus_per_node']} GPUs = {c['gpus']:,} GPUs sampled every "
        f"{c['sample_interval_s']:g} s, one batch per node every {c['ship_interval_s']:g} s "
        f"({c['samples_per_batch']} samples per GPU per batch), {c['fields_per_sample']} fields per sample",
        f"  {c['api_workers']} API processes, worker {'on' if c['worker'] else 'off'}, {c['connections']} connections, "
        f"{c['cpus']} CPUs, database {c['database']}",
        "",
        f"paced, open loop ({c['duration_s']:g} s)",
        f"  offered           {paced['offered_samples_per_s']:>10,.0f} GPU samples/s  "
        f"{paced['offered_requests_per_s']:>7,.0f} requests/s",
        f"  sustained         {paced['samples_per_s']:>10,.0f} GPU samples/s  "
        f"{paced['requests_per_s']:>7,.0f} requests/s"
        f"  ({paced['sustained_ratio']:.3f} of offered)",
        f"  latency           {_ms(paced['latency_ms'])}  (from the scheduled send time)",
        f"  service time      {_ms(paced['service_ms'])}  (from the write)",
        f"  failures          {_failures(paced)}",
        f"  kept up           {'yes' if paced['kept_up'] else 'NO'}  (sustained >= 0.98 x offered and p99 < ship "
        "interval)",
    ]
    if paced["concurrency_needed"] > c["connections"]:
        lines.append(
            f"  note              at this service time the offered rate needs ~{paced['concurrency_needed']:,.0f} "
            f"requests in flight; --connections {c['connections']} queues the rest in the client"
        )
    lines += [
        "",
        f"capacity, closed loop ({cap['elapsed_s']:.1f} s, {c['connections']} connections)",
        f"  throughput        {cap['samples_per_s']:>10,.0f} GPU samples/s  {cap['requests_per_s']:>7,.0f} requests/s",
        f"  latency           {_ms(cap['latency_ms'])}",
        f"  failures          {_failures(cap)}",
        "",
        f"raw psycopg COPY, same database, same rows ({f['copy_baseline']['rows_per_transaction']:,} rows per "
        "transaction, a full server flush)",
    ]
    copy = f["copy_baseline"]
    lines.append(
        f"  binary COPY, as the server writes {copy['rows_per_s']:>10,.0f} rows/s  ({copy['rows']:,} rows in "
        f"{copy['seconds']:.1f} s)   HTTP capacity / COPY = {f['ratio_capacity_to_copy']:.2f}"
    )
    lines += [
        "",
        f"rows stored         {rows['stored']:,} metric_samples rows for {rows['ok_samples']:,} samples answered 2xx: "
        + ("match" if rows["match"] else "MISMATCH"),
    ]
    for phase, cores in f["cpu_cores"].items():
        lines.append(f"CPU cores, {phase:<9} {format_cores(cores)}")
    lines += ["", *_target_lines(f["targets"], paced)]
    return "\n".join(lines)


def _target_lines(targets: dict[str, Any], paced: dict[str, Any]) -> list[str]:
    size, checks = targets["size_reached"], targets["checks"]
    p99, api = paced["latency_ms"]["p99"], paced["api_cores"]
    lines = [
        f"targets ({targets['gpus']:,} GPUs sampled at 1 s, shipped every {TARGET_SHIP_S:g} s or more often)"
        + ("" if size else ": not judged below that size"),
        f"  kept up, >= {TARGET_FIELDS} fields, worker on    {_verdict(checks['kept_up'], size)}",
        f"  HTTP capacity / COPY >= {TARGET_RATIO}          {_verdict(checks['copy_ratio'], size)}",
        f"  paced p99 < {TARGET_P99_MS:g} ms                  {_verdict(checks['p99_ms'], size)}  "
        f"({'-' if p99 is None else f'{p99:,.1f} ms'})",
        f"  API < {TARGET_API_CORES:g} cores (paced)             {_verdict(checks['api_cores'], size)}  "
        f"({'-' if api is None else f'{api:.2f} cores'})",
    ]
    if size:
        lines.append(f"  all targets                         {'met' if targets['met'] else 'NOT met'}")
    return lines
