"""Processes that die on one line: DataLoader workers, fatal signals, `Fatal Python error`."""

from __future__ import annotations

import re

from agents.parsers.training.common import MAX_MESSAGE, Emit

_DL_KILLED = re.compile(
    r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited unexpectedly)"
)
_DL_BUS = re.compile(r"(?i)unexpected bus error encountered in worker")

_FATAL_PYTHON = re.compile(r"Fatal Python error: (.+)")
# What the shell prints for a child killed by a signal: "Segmentation fault (core dumped)",
# "/bin/bash: line 1: 1234 Killed   python train.py".
_SIGNAL = re.compile(
    r"(?:^|\s)(Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception|Killed)"
    r"(?: \(core dumped\))?(?:\s+\S.{0,300})?$"
)
_SIGNAL_REASON = {
    "Segmentation fault": "segfault",
    "Aborted": "abort",
    "Bus error": "bus_error",
    "Illegal instruction": "illegal_instruction",
    "Floating point exception": "fpe",
    "Killed": "killed",
}


def rule_dataloader(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "worker" not in low:
        return False
    m = _DL_KILLED.search(body)
    if m:
        pids = [int(p) for p in re.findall(r"\d+", m.group(1))]
        emit("dataloader_died", "error", {"pids": pids, "signal": (m.group(2) or "").strip() or None}, critical=True)
        return True
    if _DL_BUS.search(body):
        # PyTorch's SIGBUS handler in the worker: almost always /dev/shm too small for the batches.
        emit("dataloader_died", "error", {"pids": [], "signal": "Bus error", "shm": True}, critical=True)
        return True
    return False


def rule_crash(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "Fatal Python error" in body:
        m = _FATAL_PYTHON.search(body)
        if m:
            fields = {"reason": "fatal_python_error", "message": m.group(1).strip()[:MAX_MESSAGE]}
            emit("crash", "error", fields, critical=True)
            return True
    if "core dumped" in body or body.strip() in _SIGNAL_REASON or ": line " in body:
        m = _SIGNAL.search(body)
        if m:
            fields = {"reason": _SIGNAL_REASON[m.group(1)], "message": body.strip()[:MAX_MESSAGE]}
            emit("crash", "error", fields, critical=True)
            return True
    return False
