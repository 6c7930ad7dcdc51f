"""The soak's stand-in for a node's agent process: it reads the simulated node as the agent reads a real one,
with the agent's own code, on the simulated clock.

The agent's pieces it uses: ExporterParser on the node's dcgm-exporter text, KernelLogParser and
TrainingLogParser on the node's log lines, NodeCollectors and PortWatch on the node's fake kernel tree (written to
disk as the simulator writes it). What it does itself: the clock (simulated time plus the node's skew), the process
list (one worker per live rank, as the process scanner reports it) and the agent's restarts: stopped, it
samples nothing; started again, it has fresh parsers and counter baselines and reads the lines written while
it was down, as an agent does from its saved positions; a late node's first start reads from the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from agents.events import Event
from agents.gpu import ExporterParser, GpuReading
from agents.node import NodeCollectors
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training import DEFAULT_STEP_PATTERNS, TrainingLogParser
from agents.port_watch import PortWatch
from lab.sim import stacks
from lab.sim.exporter import render
from lab.sim.gpu import GpuSample
from lab.sim.kerneltree import NodeTree, TreeWriter
from lab.sim.model import Cluster, LogLine
from lab.sim.modes import DEAD

AGENT_VERSION = "soak"
RSS_BYTES = 6 << 30  # a training rank's resident memory, roughly


class VirtualAgent:
    def __init__(self, cluster: Cluster, node: int, *, job_id: str, tree_dir: Path, pid_base: int) -> None:
        self.cluster, self.node, self.job_id = cluster, node, job_id
        self.name = cluster.node_names[node]
        self.tree = NodeTree(self.name, cluster.hosts[node], cluster.fabrics[node])
        self.root = tree_dir / self.name
        self.writer = TreeWriter(self.root)
        self.writer.sync(self.tree.files())
        self.pid_base = pid_base
        self.running = False
        self.ever_started = False
        self.started_at: datetime | None = None
        self.held: list[LogLine] = []  # lines written while the agent was down: read when it starts again
        self.metrics: list[dict[str, Any]] = []
        self.node_metrics: list[dict[str, Any]] = []
        self.events: list[Event] = []
        self.inventory: list[dict[str, Any]] = []
        self.batches = 0
        self._fed: set[Any] = set()  # the parsers fed lines in the last simulated second

    # -- the agent's life --

    def start(self, now: datetime) -> None:
        """A fresh agent process: new parsers and counter baselines; the lines it missed, unless it never ran."""
        self.exporter = ExporterParser()
        boot = datetime.fromtimestamp(self.cluster.hosts[self.node].btime).astimezone()
        self.kernel = KernelLogParser(boot_time=boot)
        self.training = TrainingLogParser(step_patterns=DEFAULT_STEP_PATTERNS, path=str(self.root / "train.log"))
        place = self.cluster.location(self.node)  # where the machine sits (lab/sim/shared_faults.py)
        self.collectors = NodeCollectors(
            sysfs_root=self.root / "sys",
            procfs_root=self.root / "proc",
            volumes=[],
            location={k: place[k] for k in ("rack", "switch", "power_domain")},
            storage_mounts=place["storage_mounts"],
        )
        self.collectors.prime()
        self.port_watch = PortWatch()
        self._fed = set()
        held, self.held = self.held, []
        if self.ever_started:  # its saved positions: it goes on where it stopped
            self.read_lines(held, now)
        self.running, self.ever_started, self.started_at = True, True, self._clock(now)

    def stop(self, signal: str) -> None:
        """TERM ships what it holds on the way out (the caller ships next); KILL loses nothing either: the agent's
        journal and spool replay it after the restart. Either way nothing is gathered while it is down."""
        self.running = False

    # -- sources --

    def _clock(self, now: datetime) -> datetime:
        return now + self.cluster.skew[self.node]

    def read_lines(self, lines: list[LogLine], now: datetime) -> None:
        if not self.running:
            if self.ever_started:
                self.held += lines
            return
        wall = self._clock(now)
        fed: set[Any] = set()
        for line in lines:
            parser = self.kernel if line.stream == "kern" else self.training
            fed.add(parser)
            for text in line.text.split("\n"):
                self.events += parser.feed(text, now=wall)
        # As the agent does (agents/agent.py IDLE_FLUSH, 1 s): a stream with no new line for a second has its
        # block complete (a Xid record waits for the line after it), and a critical one then ships at once.
        for parser in self._fed - fed:
            self.events += parser.flush(now=wall)
        self._fed = fed

    def has_critical(self) -> bool:
        """Whether a critical event waits: the agent ships it at once, not at its next ship tick."""
        return self.running and any(e.critical for e in self.events)

    def sample(self, now: datetime, gpus: Sequence[GpuSample]) -> None:
        """One GPU reading (the node's GPUs in the cluster's snapshot), stamped with the node's clock."""
        if not self.running:
            return
        readings: list[GpuReading] = self.exporter.parse(render(gpus, self.name))
        if readings:
            self.inventory = [r.inventory() for r in readings]
        ts = self._clock(now).isoformat()
        self.metrics += [{"ts": ts, "gpu": r.gpu, "fields": r.fields} for r in readings]
        # The port watch of the agent's sample tick: the ports' state and link_downed files as they are now.
        self.writer.sync(self.tree.link_files())
        self.events += self.port_watch.changes(self.collectors.link_states(), self._clock(now))

    def batch(
        self, now: datetime, stack_requests: Sequence[str] = (), *, urgent: bool = False
    ) -> dict[str, Any] | None:
        """The ship tick: node collectors read once, then everything gathered since the last batch, with a dump of
        each live rank for every stack request (`dump_stacks` directive ids) the service sent since. `urgent`: the
        batch a critical event sends at once, as the agent's (no node reading, no process scan, parsers not flushed)."""
        if not self.running:
            return None
        wall = self._clock(now)
        if not urgent:
            self.writer.sync(self.tree.files())
            self.node_metrics += self.collectors.read(wall.isoformat())
            for parser in (self.kernel, self.training):
                self.events += parser.flush(now=wall)
            self._fed = set()
        assert self.started_at is not None
        # As the agent finds its job from the training processes: a spare, or a machine in repair, runs none.
        job = self.job_id if self.cluster.node_rank(self.node) is not None else None
        out: dict[str, Any] = {
            "batch_id": str(uuid.uuid4()),
            "node": self.name,
            "job_id": job,
            "sent_at": wall.isoformat(),
            "heartbeat": {
                "agent_version": AGENT_VERSION,
                "uptime_s": round((wall - self.started_at).total_seconds(), 1),
                "jobs": [job] if job else [],
                "gpus": self.inventory,
                "host": self.collectors.facts(),
            },
            "metrics": self.metrics,
            "node_metrics": self.node_metrics,
            "logs": [e.to_wire() for e in self.events],
            "stacks": [dump for directive in stack_requests for dump in self._dumps(directive, wall)],
            "processes": [] if urgent else self._processes(wall),
        }
        self.metrics, self.node_metrics, self.events = [], [], []
        self.batches += 1
        return out

    def _dumps(self, directive_id: str, wall: datetime) -> list[dict[str, Any]]:
        """`py-spy dump` of each of the node's live ranks, answering one stack request, as the agent ships them."""
        c, out = self.cluster, []
        for rank in c.ranks_on(self.node):  # none on a spare
            names = stacks.frames(c.modes[rank], c.activity(rank))
            if names is None:
                continue  # no process left to dump
            pid = self.pid(rank)
            out.append(
                {
                    "ts": wall.isoformat(),
                    "pid": pid,
                    "job_id": self.job_id,
                    "rank": rank,
                    "directive_id": directive_id,
                    "threads": stacks.pyspy_threads(pid, names),
                }
            )
        return out

    def _processes(self, wall: datetime) -> list[dict[str, Any]]:
        """The node's live rank processes, as the agent's process scanner reports them."""
        c = self.cluster
        out = []
        for local, rank in enumerate(c.ranks_on(self.node)):  # none on a spare
            if c.modes[rank] in DEAD:
                continue
            out.append(
                {
                    "ts": wall.isoformat(),
                    "pid": self.pid(rank),
                    "job_id": self.job_id,
                    "rank": rank,
                    "local_rank": local,
                    "group_rank": c.node_rank(self.node),
                    "world_size": c.world,
                    "gpu": local,
                    "cpu_pct": 100.0,
                    "rss_bytes": RSS_BYTES,
                    "state": "R",
                    "children": [],
                }
            )
        return out

    def pid(self, rank: int) -> int:
        """A restart starts fresh processes: new pids each generation."""
        return self.pid_base + self.cluster.generation * self.cluster.world + rank
