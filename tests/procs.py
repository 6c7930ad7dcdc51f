"""Start and stop real service processes for tests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

from service.embedded import free_port
from service.processes import healthy, spawn, stop, wait_healthy

# How long an API process may take to start: importing the service takes seconds, and far longer on a loaded VM.
API_START_S = 120.0
# How long a CPU torch job's ranks may take to reach their first steps: each imports torch, on a VM of two cores.
TORCH_STEPS_S = 300.0


def wait_for(predicate: Callable[[], bool], *, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_api(url: str) -> None:
    """Until the API at `url` answers its health check."""
    wait_for(lambda: healthy(url), timeout=API_START_S, what="the API")


def wait_worker_ready(*, timeout: float = 120) -> None:
    """Until a Celery worker answers a ping: its start (importing the service, scikit-learn, SciPy) takes seconds on
    a fast machine and far longer on a loaded one, so a fixed sleep would time what is not under test."""
    from service.worker import celery_app

    wait_for(lambda: bool(celery_app.control.ping(timeout=0.5)), timeout=timeout, what="a worker to answer a ping")


@contextmanager
def running(args: list[str], *, env: dict[str, str] | None = None, log: Path | None = None) -> Iterator[Popen[bytes]]:
    """Run `python -m <args>`; on exit stop it (SIGTERM, then SIGKILL)."""
    process = spawn(args, env={**os.environ, **(env or {})}, log=log)
    try:
        yield process
    finally:
        stop(process)


@contextmanager
def api_server(env: dict[str, str] | None = None, log: Path | None = None, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    with running(["faultline", "serve", "--port", str(port)], env=env, log=log) as process:
        wait_healthy(url, process, timeout=API_START_S, log=log)
        yield url
