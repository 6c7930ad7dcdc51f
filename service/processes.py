"""Child processes of the service's own commands (demo, bench, tests): start, wait for health, stop."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this child when its parent dies, however it dies."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(module_args: list[str], *, env: dict[str, str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """`python -m <module_args>` in its own session: Ctrl-C reaches only the parent, which stops it.

    The child also stops if the parent is killed outright, so nothing is left running behind it.
    """
    out: IO[bytes] | int = log.open("ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", *module_args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    finally:
        if not isinstance(out, int):
            out.close()  # the child has its own copy of the descriptor


def stop(process: subprocess.Popen[Any], *, timeout: float = 20) -> None:
    """SIGTERM (graceful: uvicorn and Celery finish what they are doing), then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(url: str, process: subprocess.Popen[Any], *, timeout: float = 90, log: Path | None = None) -> None:
    where = f"; see {log}" if log else ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited with code {process.returncode}{where}")
        if healthy(url):
            return
        time.sleep(0.3)
    raise RuntimeError(f"the API did not become healthy within {timeout:.0f} s{where}")
