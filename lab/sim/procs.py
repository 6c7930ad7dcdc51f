"""Child processes that cannot outlive the simulator.

Each child gets its own session (so its whole process group can be signalled at once, and a Ctrl-C in
the terminal reaches only the simulator, which then shuts down in order) and, on Linux,
PR_SET_PDEATHSIG=SIGKILL, so even a SIGKILLed simulator leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import IO

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved now, not in the forked child
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive SIGKILL when this process (thread) dies.

    Call it in the thread that spawns: Linux ties the death signal to the creating thread.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def spawn(
    args: list[str], *, env: dict[str, str], stdout: IO[bytes] | IO[str] | int | None, new_session: bool = True
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        start_new_session=new_session,
        preexec_fn=die_with_parent(),  # a pre-resolved prctl call only: safe despite our threads
        close_fds=True,
    )


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_all(procs: Iterable[subprocess.Popen[bytes]], *, timeout: float = 5.0, group: bool = True) -> None:
    """SIGTERM every process (group), wait up to `timeout` in total, then SIGKILL what is left."""
    procs = list(procs)
    for p in procs:
        if group:
            signal_group(p, signal.SIGTERM)
        elif p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if group:
            signal_group(p, signal.SIGKILL)  # also reaches grandchildren whose parent already exited
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=2.0)
