"""Faults of the campaign's own service (issue 44, point 6): its worker, API, Redis and PostgreSQL killed and restarted
at random moments, seeded so that a run's schedule repeats.

- `schedule`: when (the campaign's simulated second), what, how long after that tick the blow lands (wall seconds:
  inside whatever the process is doing then) and how long the target stays down (wall seconds).
- `Chaos`: deals the blows to real processes with real signals and restarts them, logging the moment of each:
  the worker and the API are SIGKILLed (their whole process group: a Celery worker's pool children too) and started
  again as a supervisor would; PostgreSQL gets an immediate stop (`pg_ctl -m immediate`: no checkpoint, crash
  recovery at the next start); Redis is SIGKILLed and started again on its port and folder (its append-only file
  brings back what it had written).

PostgreSQL's blow lands at the tick itself, not later: the harness that plays the scheduler and the operator shares
the database with the service, and its own steps wait for the restart (`Chaos.db_up`) rather than fail half-way.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TARGETS = ("worker", "api", "redis", "postgres")
DOWN_S = (1.0, 6.0)  # how long a target stays down, wall seconds, drawn uniformly
LAND_S = (0.0, 2.0)  # how long after its tick a blow lands, wall seconds (PostgreSQL's: at the tick)


@dataclass(frozen=True)
class Blow:
    t_s: float  # the campaign's simulated second it is due at
    target: str  # worker | api | redis | postgres
    land_s: float  # wall seconds after that tick
    down_s: float  # wall seconds before the restart


def schedule(
    seed: int,
    *,
    blows: int,
    span_s: tuple[float, float],
    targets: tuple[str, ...] = TARGETS,
    down_s: tuple[float, float] = DOWN_S,
) -> list[Blow]:
    """`blows` blows over the simulated span, every target in turn (each hit at least once when there are enough),
    at uniformly drawn moments, sorted; the same seed gives the same list."""
    if blows < 0 or span_s[1] < span_s[0]:
        raise ValueError("need blows >= 0 and a span whose end is not before its start")
    rng = random.Random(seed)
    order = list(targets)
    rng.shuffle(order)
    out = []
    for k in range(blows):
        target = order[k % len(order)]
        land = 0.0 if target == "postgres" else round(rng.uniform(*LAND_S), 2)
        out.append(Blow(round(rng.uniform(*span_s), 1), target, land, round(rng.uniform(*down_s), 2)))
    return sorted(out, key=lambda b: b.t_s)


@dataclass
class Target:
    """How to kill one of the service's processes and how to bring it back."""

    name: str
    kill: Callable[[], int | None]  # deals the blow; the pid it hit, if any
    restart: Callable[[], int | None]  # the new pid, if any


@dataclass
class Chaos:
    """Deals a schedule's blows to the targets, one at a time (a blow waits for the previous restart).

    Every blow and restart runs on one long-lived thread: a child started with PR_SET_PDEATHSIG (service/processes.py
    `spawn`) is signalled when the *thread* that started it exits, so a restart from a passing thread would die with
    it."""

    blows: list[Blow]
    targets: dict[str, Target]
    say: Callable[[str], None] = print
    log: list[dict[str, Any]] = field(default_factory=list)
    db_up: threading.Event = field(default_factory=threading.Event)
    up: dict[str, threading.Event] = field(default_factory=dict)
    _next: int = 0
    _jobs: queue.Queue[Callable[[], None]] = field(default_factory=queue.Queue)
    _runner: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.db_up.set()
        for name in TARGETS:
            self.up[name] = self.db_up if name == "postgres" else threading.Event()
            self.up[name].set()

    def due(self, t: float) -> None:
        """At the harness's simulated second `t`: deal the blows due by then (PostgreSQL's at once, in this thread)."""
        while self._next < len(self.blows) and self.blows[self._next].t_s <= t:
            blow = self.blows[self._next]
            self._next += 1
            self.wait_idle()
            if blow.target == "postgres":
                entry = self._kill(blow, t)
                self._submit(lambda b=blow, e=entry: self._bring_back(b, e))
            else:
                self._submit(lambda b=blow: self._bring_back(b, self._kill(b, t)))

    def wait_idle(self) -> None:
        """Until the blow in progress has restarted its target."""
        self._jobs.join()

    def _submit(self, job: Callable[[], None]) -> None:
        if self._runner is None:
            self._runner = threading.Thread(target=self._run, name="chaos", daemon=True)
            self._runner.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            finally:
                self._jobs.task_done()

    def _kill(self, blow: Blow, t: float) -> dict[str, Any]:
        time.sleep(blow.land_s)
        entry: dict[str, Any] = {**asdict(blow), "tick_s": t, "killed_at": _stamp()}
        self.up[blow.target].clear()  # as the blow lands: work already under way meets it
        try:
            entry["pid"] = self.targets[blow.target].kill()
        except Exception as exc:  # a blow that could not be dealt is logged, and the run goes on
            entry["error"] = f"kill: {exc!r}"
        self.say(f"chaos: t={t:.0f}s {blow.target} killed (pid {entry.get('pid')}), down for {blow.down_s:.1f} s")
        return entry

    def _bring_back(self, blow: Blow, entry: dict[str, Any]) -> None:
        time.sleep(blow.down_s)
        began = time.monotonic()
        try:
            entry["new_pid"] = self.targets[blow.target].restart()
        except Exception as exc:
            entry["error"] = f"restart: {exc!r}"
            self.say(f"chaos: {blow.target} did not come back: {exc!r}")
        entry["restarted_at"] = _stamp()
        entry["restart_took_s"] = round(time.monotonic() - began, 2)
        self.log.append(entry)
        self.up[blow.target].set()
        self.say(
            f"chaos: {blow.target} restarted (pid {entry.get('new_pid')}) after {blow.down_s:.1f} s down, "
            f"{entry['restart_took_s']:.1f} s to start"
        )


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# -- the blows themselves --


def kill_group(process: subprocess.Popen[bytes]) -> int:
    """SIGKILL a child started in its own session (service/processes.py `spawn`) and everything in its group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    return process.pid


def stop_postgres_immediately(pgdata: Path) -> int | None:
    """`pg_ctl stop -m immediate`: the postmaster and its backends quit at once, as in a crash (recovery on start)."""
    from pgserver._commands import pg_ctl  # the embedded server's own pg_ctl (service/embedded.py)

    pid = postmaster_pid(pgdata)
    pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=pgdata, user=_pg_user())
    return pid


def restart_postgres(server: Any, *, tries: int = 3) -> int | None:
    """Start a pgserver PostgresServer again after a stop (its crash recovery first); the new postmaster's pid.

    pgserver gives `pg_ctl start` 10 s; crash recovery on a loaded machine can take longer, and the server goes on
    starting after pg_ctl's wait has been given up: asking again finds it running."""
    for attempt in range(tries):
        try:
            server.ensure_postgres_running()
            break
        except (subprocess.SubprocessError, OSError):
            if attempt == tries - 1:
                raise
            time.sleep(2.0)
    return postmaster_pid(Path(server.pgdata))


def _pg_user() -> str | None:
    return "pgserver" if os.geteuid() == 0 else None  # as pgserver runs its server when started as root


def postmaster_pid(pgdata: Path) -> int | None:
    pid_file = pgdata / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(pid_file.read_text().splitlines()[0])
    return None
