"""Training processes on this host, from /proc: torchrun workers by their environment.

A worker is a process whose environment has RANK (torchrun, torch.distributed.launch and most launchers
set it); a descendant that inherited the same RANK and job is one of its children (a data loader
worker), reported under it. Environments are read once per process: they do not change, and reading
every process's environ every few seconds would cost more than everything else the agent does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

DEFAULT_JOB_ENV = ("FAULTLINE_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
_TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "TORCHELASTIC_RUN_ID",
    "CUDA_VISIBLE_DEVICES",
)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")
_MISSING_JOB_IDS = {"", "none"}  # torchrun's default rdzv id is the string "none"


@dataclass(slots=True)
class ProcStat:
    pid: int
    ppid: int
    state: str
    cpu_ticks: int
    start_ticks: int
    rss_bytes: int
    name: str


def read_stat(pid: int, proc: Path = Path("/proc")) -> ProcStat | None:
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    close = raw.rfind(b")")
    name = raw[raw.find(b"(") + 1 : close].decode(errors="replace")
    rest = raw[close + 2 :].split()
    return ProcStat(
        pid=pid,
        ppid=int(rest[1]),
        state=rest[0].decode(),
        cpu_ticks=int(rest[11]) + int(rest[12]),
        start_ticks=int(rest[19]),
        rss_bytes=int(rest[21]) * _PAGE,
        name=name,
    )


def read_environ(pid: int, wanted: frozenset[bytes], proc: Path = Path("/proc")) -> dict[str, str]:
    """The variables of `wanted` in a process's environment (empty if it is gone or not ours to read)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in wanted:
            env[key.decode()] = value.decode(errors="replace")
    return env


def _int(env: dict[str, str], key: str) -> int | None:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        return None


def physical_gpu(visible: str, local_rank: int | None) -> int | None:
    """The node's GPU index a worker uses: a torchrun worker takes device `local_rank` among the visible ones
    (`cuda:LOCAL_RANK`), so with CUDA_VISIBLE_DEVICES="4,5,6,7" local rank 1 is GPU 5; one visible device is
    that GPU whatever the rank. Devices named by UUID or MIG name cannot be placed without NVML: the local
    rank is the best guess then, as with no variable at all."""
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if len(devices) == 1 and devices[0].isdigit():
        return int(devices[0])
    if local_rank is not None and 0 <= local_rank < len(devices) and devices[local_rank].isdigit():
        return int(devices[local_rank])
    return local_rank


@dataclass(slots=True)
class Worker:
    """One training process and what the agent reports about it."""

    pid: int
    env: dict[str, str]
    job_id: str | None
    stat: ProcStat
    cpu_pct: float | None = None
    children: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rank(self) -> int | None:
        return _int(self.env, "RANK")

    def snapshot(self, ts: datetime) -> dict[str, Any]:
        local_rank = _int(self.env, "LOCAL_RANK")
        gpu = physical_gpu(self.env.get("CUDA_VISIBLE_DEVICES", ""), local_rank)
        out: dict[str, Any] = {
            "ts": ts.isoformat(),
            "pid": self.pid,
            "job_id": self.job_id,
            "rank": self.rank,
            "local_rank": local_rank,
            "group_rank": _int(self.env, "GROUP_RANK"),
            "world_size": _int(self.env, "WORLD_SIZE"),
            "gpu": gpu,
            "cpu_pct": self.cpu_pct,
            "rss_bytes": self.stat.rss_bytes,
            "state": self.stat.state,
            "children": self.children,
        }
        return {k: v for k, v in out.items() if v is not None}


class ProcessScanner:
    """Finds torchrun workers, optionally only below one process (`--watch-pid`)."""

    def __init__(
        self, *, job_env: Sequence[str] = DEFAULT_JOB_ENV, watch_pid: int | None = None, proc: Path = Path("/proc")
    ) -> None:
        self.job_env = tuple(job_env)
        self.watch_pid = watch_pid
        self.proc = proc
        self._wanted = frozenset(name.encode() for name in (*_TORCHRUN_ENV, *self.job_env))
        self._env_cache: dict[tuple[int, int], dict[str, str]] = {}
        self._last_cpu: dict[tuple[int, int], tuple[int, float]] = {}

    def job_of(self, env: dict[str, str]) -> str | None:
        for name in self.job_env:
            value = env.get(name, "").strip()
            if value.lower() not in _MISSING_JOB_IDS:
                return value
        return None

    def _pids(self) -> Iterable[int]:
        for entry in os.scandir(self.proc):
            if entry.name.isdigit():
                yield int(entry.name)

    def scan(self, now: float) -> list[Worker]:
        stats = {s.pid: s for pid in self._pids() if (s := read_stat(pid, self.proc)) is not None}
        children: dict[int, list[int]] = {}
        for s in stats.values():
            children.setdefault(s.ppid, []).append(s.pid)
        if self.watch_pid is not None:
            if self.watch_pid not in stats:
                return []
            scope = self._subtree(self.watch_pid, children)
        else:
            scope = list(stats)
        envs: dict[int, dict[str, str]] = {}
        for pid in scope:
            key = (pid, stats[pid].start_ticks)
            env = self._env_cache.get(key)
            if env is None:
                env = self._env_cache[key] = read_environ(pid, self._wanted, self.proc)
            envs[pid] = env
        live = {(pid, stats[pid].start_ticks) for pid in scope}
        self._env_cache = {k: v for k, v in self._env_cache.items() if k in live}

        workers = []
        for pid in scope:
            env = envs[pid]
            if "RANK" not in env:
                continue
            parent_env = envs.get(stats[pid].ppid, {})
            if parent_env.get("RANK") == env["RANK"] and self.job_of(parent_env) == self.job_of(env):
                continue  # a child (data loader worker) of a worker
            stat = stats[pid]
            worker = Worker(pid, env, self.job_of(env), stat, cpu_pct=self._cpu_pct(stat, now))
            for child in self._subtree(pid, children)[1:]:
                cs = stats[child]
                worker.children.append(
                    {"pid": child, "name": cs.name, "cpu_pct": self._cpu_pct(cs, now), "rss_bytes": cs.rss_bytes}
                )
            workers.append(worker)
        self._last_cpu = {k: v for k, v in self._last_cpu.items() if k in live}
        return sorted(workers, key=lambda w: (w.rank if w.rank is not None else -1, w.pid))

    def _subtree(self, root: int, children: dict[int, list[int]]) -> list[int]:
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def _cpu_pct(self, stat: ProcStat, now: float) -> float | None:
        """CPU use since the previous scan, in percent of one core (None on first sight)."""
        key = (stat.pid, stat.start_ticks)
        previous = self._last_cpu.get(key)
        self._last_cpu[key] = (stat.cpu_ticks, now)
        if previous is None or now <= previous[1]:
            return None
        return round(100.0 * (stat.cpu_ticks - previous[0]) / _TICKS / (now - previous[1]), 1)
