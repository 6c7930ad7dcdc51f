"""The benchmarks' backend and processes: PostgreSQL and Redis (given or embedded), a token for the run, the
service's API, worker and beat as child processes, and the load generator process, followed to its end."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pydantic import ValidationError

from lab.bench import cpu
from lab.bench.loadgen_protocol import LoadConfig, config_json
from service import processes
from service.config import get_settings, to_libpq_url


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
        [sys.executable, "-m", "lab.bench.loadgen"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
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
