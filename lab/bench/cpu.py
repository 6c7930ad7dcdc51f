"""CPU time of process trees and of the whole machine, from /proc (Linux; elsewhere nothing is measured).

The benchmark shares few cores between the API, the worker, PostgreSQL and its own load generator;
where the CPU went tells whether the server or the harness is the limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class _Stat:
    ppid: int
    cpu_s: float  # its own CPU time plus that of its children it has reaped (exited backends, say)


def _stat(pid: int) -> _Stat | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return _Stat(ppid=int(fields[1]), cpu_s=(utime + stime + cutime + cstime) / TICK)


def all_stats() -> dict[int, _Stat]:
    stats = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    return stats


def tree_cpu_seconds(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process and all its descendants."""
    stats = all_stats()
    return {
        name: sum(stats[pid].cpu_s for pid in tree_pids(stats, root)) for name, root in roots.items() if root in stats
    }


def tree_pids(stats: dict[int, _Stat], root: int) -> list[int]:
    """`root` and all its descendants among `stats`' processes."""
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat.ppid, []).append(pid)
    found, todo = [], [root] if root in stats else []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot."""
    try:
        first = (_PROC / "stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def parent_pid(pid: int) -> int | None:
    stat = _stat(pid)
    return stat.ppid if stat else None


def command_name(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


class CpuMeter:
    """Cores used by each process tree (and by the whole machine) between start() and stop()."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self._cpu: dict[str, float] = {}
        self._machine: tuple[int, int] | None = None
        self._wall = 0.0

    def start(self, now: float) -> None:
        self._cpu = tree_cpu_seconds(self.roots)
        self._machine = machine_ticks()
        self._wall = now

    def stop(self, now: float) -> dict[str, float]:
        wall = max(now - self._wall, 1e-9)
        end = tree_cpu_seconds(self.roots)
        cores = {name: round((end[name] - self._cpu[name]) / wall, 2) for name in end if name in self._cpu}
        machine = machine_ticks()
        if machine and self._machine and machine[1] > self._machine[1]:
            busy = (machine[0] - self._machine[0]) / (machine[1] - self._machine[1])
            cores["machine"] = round(busy * (os.cpu_count() or 1), 2)
        return cores


def format_cores(cores: dict[str, float]) -> str:
    """Cores per process tree, and what the rest of the machine used."""
    named = {name: value for name, value in cores.items() if name != "machine"}
    text = "  ".join(f"{name} {value:.2f}" for name, value in named.items())
    if "machine" in cores:
        # CPU used by processes outside the benchmark (or by ones it cannot see) skews every figure.
        other = max(0.0, cores["machine"] - sum(named.values()))
        text += f"  other {other:.2f}  (machine {cores['machine']:.2f} of {os.cpu_count()})"
    return text
