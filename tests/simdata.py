"""Turns an in-process simulated cluster run into the plain data the ml/ detectors take.

Metrics come from the model's DCGM snapshots (each node sampled at its own phase, as unsynchronized
agents do), step records from the agent's real training-log parser fed the model's log lines, and
process snapshots from the ranks' modes (a rank that crashed, aborted or was torn down vanishes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from agents.parsers.training import TrainingLogParser
from lab.sim.config import SimConfig
from lab.sim.gpu import TICK
from lab.sim.model import Cluster
from lab.sim.modes import CULPRIT_DATA, DEAD, NORMAL
from ml.findings import JobInfo, LogRecord
from ml.metrics import FIELD_TO_COLUMN

# DCGM's "not supported" blanks (values near INT64_MAX): the agent and the ingest drop them, so the detectors
# never see them (service.ingest.service.DCGM_BLANK_THRESHOLD; the ml tests import nothing of the service).
DCGM_BLANK_THRESHOLD = 9.0e18

START = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)

# Percent of one core a rank's main thread uses, by mode: a PyTorch rank busy-waits on CUDA (training or
# stuck in a collective); one blocked in its data loader sleeps on a queue.
_CPU_BY_MODE = {NORMAL: 97.0, CULPRIT_DATA: 2.0}
_CPU_DEFAULT = 99.0


@dataclass
class SimRun:
    """Advance a simulated cluster and keep what the agents would have shipped."""

    scenario: str
    nodes: int = 4
    gpus: int = 8
    seed: int = 1
    fault_after: float = 30.0
    sample_s: float = 1.0
    process_s: float = 5.0
    watchdog_seconds: float = 20.0
    hang_timeout_s: float = 600.0
    cluster: Cluster = field(init=False)
    metric_rows: list[dict[str, Any]] = field(default_factory=list, init=False)
    process_rows: list[dict[str, Any]] = field(default_factory=list, init=False)
    step_records: list[LogRecord] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        config = SimConfig(
            nodes=self.nodes,
            gpus_per_node=self.gpus,
            scenario=self.scenario,
            seed=self.seed,
            fault_after=self.fault_after,
            watchdog_seconds=self.watchdog_seconds,
            start=START,
        )
        self.cluster = Cluster(config)
        self._parsers = {name: TrainingLogParser(path="/logs/train.log") for name in self.cluster.node_names}
        self._rng = random.Random(self.seed * 7919 + 1)  # its own stream: never moves the model's faults
        # Each node's agent samples at its own phase; in whole ticks.
        self._phase = [round(self._rng.random() * self.sample_s / TICK) for _ in range(self.nodes)]
        self._ticks = 0
        self._ids = 0
        self._frame: pd.DataFrame | None = None
        self._procs: pd.DataFrame | None = None

    # --- driving ---

    def run(self, until: float) -> SimRun:
        """Advance simulated time to `until` seconds, recording samples, steps and processes."""
        sample_ticks = max(1, round(self.sample_s / TICK))
        process_ticks = max(1, round(self.process_s / TICK))
        while (self._ticks + 1) * TICK <= until + 1e-9:
            self._ticks += 1
            t = self._ticks * TICK
            for line in self.cluster.advance(t):
                if line.stream == "train":
                    self._parse(line.node, line.text)
            snap = None
            for n, name in enumerate(self.cluster.node_names):
                if (self._ticks - self._phase[n]) % sample_ticks == 0:
                    snap = snap if snap is not None else self.cluster.snapshot()
                    self._record_metrics(t, name, snap[name])
            if self._ticks % process_ticks == 0:
                self._record_processes(t)
        self._frame = self._procs = None
        return self

    def _parse(self, node: str, text: str) -> None:
        parser = self._parsers[node]
        for raw in text.split("\n"):
            for event in parser.feed(raw, now=self.now):
                if event.kind != "step":
                    continue
                self._ids += 1
                self.step_records.append(
                    LogRecord(
                        id=self._ids,
                        ts=event.ts,
                        node=node,
                        kind=event.kind,
                        line=event.line,
                        severity=event.severity,
                        rank=event.rank,
                        source="training",
                        fields=dict(event.fields),
                    )
                )

    def _record_metrics(self, t: float, node: str, samples: list[Any]) -> None:
        ts = START + timedelta(seconds=t)
        for sample in samples:
            row: dict[str, Any] = {"ts": ts, "node": node, "gpu": sample.index}
            for name, value in sample.values.items():
                column = FIELD_TO_COLUMN.get(name)
                if column is not None and abs(value) < DCGM_BLANK_THRESHOLD:  # blanks dropped as the ingest does
                    row[column] = float(value)
            self.metric_rows.append(row)

    def _record_processes(self, t: float) -> None:
        ts = START + timedelta(seconds=t)
        c = self.cluster
        for rank, mode in enumerate(c.modes):
            if mode in DEAD:
                continue  # the agent no longer finds the process
            cpu = _CPU_BY_MODE.get(mode, _CPU_DEFAULT) if c.job.state == "running" or mode != NORMAL else 1.0
            self.process_rows.append(
                {
                    "ts": ts,
                    "node": c.node_names[rank // self.gpus],
                    "rank": rank,
                    "pid": 20000 + 100 * c.generation + rank,
                    "cpu_pct": max(0.0, cpu + self._rng.gauss(0, 2.0)),
                    "rss_bytes": 9_000_000_000 + rank,
                    "state": "R" if cpu > 50 else "S",
                }
            )

    # --- what the detectors take ---

    @property
    def t(self) -> float:
        return self._ticks * TICK

    @property
    def now(self) -> datetime:
        return START + timedelta(seconds=self.t)

    def at(self, t: float) -> datetime:
        return START + timedelta(seconds=t)

    @property
    def job(self) -> JobInfo:
        c = self.cluster
        rank_nodes = {r: c.node_names[r // self.gpus] for r in range(c.world)}
        return JobInfo(
            job_id=c.config.job_id or "sim",
            world_size=c.world,
            dp=c.world,
            hang_timeout_s=self.hang_timeout_s,
            rank_nodes=rank_nodes,
        )

    def metrics(self, *, until: float | None = None, lookback: float | None = None) -> pd.DataFrame:
        """Samples with ts in (until - lookback, until]: what the service would load for a run at `until`."""
        if self._frame is None:
            self._frame = pd.DataFrame(self.metric_rows)
        return _slice(self._frame, until, lookback)

    def processes(self, *, until: float | None = None, lookback: float | None = None) -> pd.DataFrame:
        if self._procs is None:
            cols = ["ts", "node", "rank", "pid", "cpu_pct", "rss_bytes", "state"]
            self._procs = pd.DataFrame(self.process_rows, columns=cols)
        return _slice(self._procs, until, lookback)

    def steps(self, *, until: float | None = None, lookback: float | None = None) -> list[LogRecord]:
        hi = START + timedelta(seconds=until) if until is not None else None
        lo = hi - timedelta(seconds=lookback) if hi is not None and lookback is not None else None
        return [r for r in self.step_records if (hi is None or r.ts <= hi) and (lo is None or r.ts > lo)]

    def fault(self) -> tuple[str, int, float]:
        """Node, GPU and injection time (seconds) of the first fault."""
        f = self.cluster.faults[0]
        node = f.nodes[0]
        return node, f.gpus[node][0], f.t


def _slice(frame: pd.DataFrame, until: float | None, lookback: float | None) -> pd.DataFrame:
    if until is None or frame.empty:
        return frame
    hi = START + timedelta(seconds=until)
    mask = frame["ts"] <= hi
    if lookback is not None:
        mask &= frame["ts"] > hi - timedelta(seconds=lookback)
    return frame[mask]
