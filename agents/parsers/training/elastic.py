"""Launchers: torchrun's elastic agent (rendezvous and store failures, workers failing, signals sent to them),
DeepSpeed's launcher (`Killing subprocess N`, `[...] exits with return code = -9`) and launchers that run
the training as a subprocess (`subprocess.CalledProcessError: ... returned non-zero exit status 1`)."""

from __future__ import annotations

import re
import signal
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit

_HEARTBEAT = re.compile(
    r"The node '([^']+)' has failed to send a keep-alive heartbeat to the rendezvous '([^']+)'"
    r"(?: due to an error of type (\w+))?"
)
_SHUTDOWN = re.compile(r"The node '([^']+)' has failed to shutdown the rendezvous '([^']*)")
_ERROR_TYPE = re.compile(r"\b(Rendezvous\w*Error|DistStoreError|DistNetworkError|RendezvousGracefulExitError)\b")
_CLOSING = re.compile(r"Sending process (\d+) closing signal (\w+)")
# The agent itself was signalled (a scheduler's stop, a preemption, a requeue, a closed terminal): it stops its
# workers in order. Printed as "Signals.SIGTERM" by recent torch, "15" by older ones.
_DEATH = re.compile(r"Received (?:Signals\.)?(\w+) death signal, shutting down workers")
_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of binary: (\S+)")
_GROUP_FAILED = re.compile(r"Worker group FAILED\. (\d+)/(\d+) attempts left")
_DS_EXIT = re.compile(r"exits with return code = (-?\d+)")
_DS_KILLING = re.compile(r"Killing subprocess (\d+)")
_NONZERO = re.compile(r"returned non-zero exit status (-?\d+)")
# Substrings one of which every message above contains: a C-speed test before the regexes.
_HINTS = (
    "endezvous",
    "DistStoreError",
    "DistNetworkError",
    "10d store",
    "closing signal",
    "death signal",
    "Worker group FAILED",
    "local_rank: ",
    "exits with return code",
    "Killing subprocess",
    "non-zero exit status",
)


def rule_elastic(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if not any(hint in body for hint in _HINTS):
        return False
    severity = "error"
    fields: dict[str, Any]
    if m := _HEARTBEAT.search(body):
        fields = {"category": "heartbeat", "node": m.group(1), "rendezvous": m.group(2), "error_type": m.group(3)}
    elif m := _SHUTDOWN.search(body):
        fields = {"category": "rendezvous_shutdown", "node": m.group(1), "rendezvous": m.group(2)}
    elif m := _CLOSING.search(body):
        severity = "warning"
        fields = {"category": "closing_signal", "pid": int(m.group(1)), "signal": m.group(2)}
    elif m := _DEATH.search(body):
        severity = "warning"
        fields = {"category": "death_signal", "signal": _death_name(m.group(1))}
    elif m := _WORKER_FAILED.search(body):
        fields = {
            "category": "worker_failed",
            "exitcode": int(m.group(1)),
            "local_rank": int(m.group(2)),
            "pid": int(m.group(3)),
            "binary": m.group(4),
        }
    elif m := _DS_EXIT.search(body) or _NONZERO.search(body):
        code = int(m.group(1))
        launcher = "deepspeed" if m.re is _DS_EXIT else "subprocess"
        fields = {"category": "worker_failed", "exitcode": code, "signal": _signal_name(code), "launcher": launcher}
    elif m := _DS_KILLING.search(body):
        severity = "warning"
        fields = {"category": "closing_signal", "pid": int(m.group(1)), "signal": None, "launcher": "deepspeed"}
    elif m := _GROUP_FAILED.search(body):
        severity = "warning"
        fields = {"category": "worker_group_restart", "attempts_left": int(m.group(1))}
    else:
        error_type = _ERROR_TYPE.search(body)
        if not error_type and "store has failed" not in low:
            return False
        store = "store" in low or (error_type is not None and "Store" in error_type.group(1))
        message = body[error_type.start() if error_type else 0 :].strip().rstrip('",')
        fields = {
            "category": "store" if store else "rendezvous",
            "error_type": error_type.group(1) if error_type else None,
            "message": message[:MAX_MESSAGE],
        }
    emit("elastic_error", severity, fields)
    return True


def _death_name(sig: str) -> str:
    """SIGTERM whether torch printed the enum's name or its number."""
    return (_signal_name(-int(sig)) or sig) if sig.isdigit() else sig


def _signal_name(exitcode: int) -> str | None:
    """A launcher reports a child killed by signal N as exit code -N: SIGKILL for -9 (often the OOM killer)."""
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return None
