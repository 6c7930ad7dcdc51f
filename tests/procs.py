"""Start and stop real service processes for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from service.embedded import free_port


def wait_for(predicate, *, timeout: float = 30, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running(
    args: list[str], *, env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[subprocess.Popen]:
    """Run `python -m <args>`; on exit stop it (SIGTERM, then SIGKILL)."""
    out = log.open("ab") if log else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", *args], env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def api_server(env: dict[str, str] | None = None, log: Path | None = None) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(["faultline", "serve", "--port", str(port)], env=env, log=log) as process:
        wait_for(lambda: process.poll() is not None or healthy(url), what=f"API at {url}")
        assert process.poll() is None, f"API exited with {process.returncode}"
        yield url
