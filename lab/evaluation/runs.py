"""One scenario run: a simulated cluster (`faultline sim`) or a real torchrun job with real agents.

Both offer the same small interface to the eval loop: start, when the fault happened, the ground truth, and a
stop that leaves no process behind (it returns what it had to kill).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from lab.evaluation.records import Fault, GroundTruth
from lab.evaluation.scenarios import (
    TORCH_FAULT_STEP,
    TORCH_FAULTS,
    TORCH_REAL_LIFE_FLAGS,
    TORCH_RESTART_AFTER_S,
)
from service.processes import spawn, stop

TORCH_NODES, TORCH_PROCS = 4, 2


class ScenarioRun(Protocol):
    job_id: str
    node_prefix: str
    world_size: int
    workdir: Path

    def start(self) -> None: ...

    def ready(self) -> bool:
        """The cluster is up (the window of a healthy run starts here)."""
        ...

    def injected_at(self) -> datetime | None: ...

    def failure(self) -> str | None:
        """Why the run cannot go on (its driver died), or None."""
        ...

    def ground_truth(self) -> GroundTruth: ...

    def stop(self) -> list[str]: ...


def _now() -> datetime:
    return datetime.now().astimezone()


def _describe(proc: Any) -> str:
    with contextlib.suppress(Exception):
        return f"{proc.pid} {proc.name()}"
    return str(getattr(proc, "pid", proc))


def reap(procs: list[Any], timeout: float = 5.0) -> list[str]:
    """Wait for these processes to end; SIGKILL the ones still there and return their descriptions."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if _status(p) not in (psutil.STATUS_ZOMBIE, None)]
    left = [_describe(p) for p in alive]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return left


def _status(proc: Any) -> str | None:
    import psutil

    try:
        return str(proc.status())
    except psutil.Error:
        return None


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


class SimRun:
    """`faultline sim` in its own folder, with node names of its own: the service keeps a node's history
    across jobs (eviction cooldowns, kernel lines in the diagnosis window), so runs must not share names."""

    def __init__(
        self,
        *,
        scenario: str,
        seed: int,
        job_id: str,
        node_prefix: str,
        workdir: Path,
        url: str,
        agent_token: str,
        env: dict[str, str],
        nodes: int,
        gpus_per_node: int,
        fault_after: float,
        duration: float,
    ) -> None:
        self.scenario, self.seed, self.job_id, self.node_prefix = scenario, seed, job_id, node_prefix
        self.workdir = workdir
        self.world_size = nodes * gpus_per_node
        self._args = [
            "faultline", "sim", "--node-prefix", f"{node_prefix}-node-",
            "--scenario", scenario, "--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node),
            "--fault-after", str(fault_after), "--seed", str(seed), "--job-id", job_id,
            "--dir", str(workdir / "sim"), "--server", url, "--duration", str(duration),
        ]  # fmt: skip
        self._env = {**env, "FAULTLINE_AGENT_TOKEN": agent_token}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.workdir / "sim.log"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = spawn(self._args, env=self._env, log=self.log)

    def _truth(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.workdir / "sim" / "ground_truth.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("job_id") == self.job_id else None

    def ready(self) -> bool:
        return self._truth() is not None

    def injected_at(self) -> datetime | None:
        data = self._truth()
        return GroundTruth.from_json(data).injected_at if data else None

    def failure(self) -> str | None:
        if self.process is not None and self.process.poll() is not None:
            return f"the sim exited with code {self.process.returncode}; see {self.log}"
        return None

    def ground_truth(self) -> GroundTruth:
        data = self._truth()
        return GroundTruth.from_json(data) if data else GroundTruth(self.scenario, self.job_id, ())

    def stop(self) -> list[str]:
        """SIGTERM: the sim stops its agents, then its launchers and ranks; then check they are all gone."""
        if self.process is None:
            return []
        procs = _tree(self.process.pid)
        stop(self.process, timeout=30)
        return reap(procs)


class _LogWatch:
    """Reads new complete lines of a growing file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        self.offset += len(chunk)
        text = self.partial + chunk.decode(errors="replace")
        *lines, self.partial = text.split("\n")
        return lines


class TorchRun:
    """A real torchrun job (4 virtual nodes x 2 ranks, gloo) with one real `faultline agent` per virtual node.

    Without a fault (torch_healthy_real) the job has real-life behaviour instead, and is restarted once from its
    last checkpoint, TORCH_RESTART_AFTER_S after it came up."""

    def __init__(
        self,
        *,
        scenario: str,
        seed: int,
        job_id: str,
        node_prefix: str,
        workdir: Path,
        url: str,
        agent_token: str,
        env: dict[str, str],
    ) -> None:
        self.scenario, self.seed, self.job_id, self.node_prefix = scenario, seed, job_id, node_prefix
        self.workdir = workdir
        self.world_size = TORCH_NODES * TORCH_PROCS
        self.fault = TORCH_FAULTS.get(scenario)
        rng = random.Random(f"{scenario}-{seed}")
        self.rank = rng.randrange(self.world_size) if self.fault and self.fault.on_rank else None
        self.step = TORCH_FAULT_STEP.get(scenario, 0)
        self._marker = self.fault.pattern(self.rank, self.step) if self.fault else None
        self._restart: threading.Thread | None = None
        self._restarting = threading.Event()
        self._stopping = threading.Event()
        self.noise: list[dict[str, Any]] = []  # the restart, as the ground truth's noise
        self.url, self._env = url, {**env, "FAULTLINE_AGENT_TOKEN": agent_token}
        self.node_names = [f"{node_prefix}-vnode-{k}" for k in range(TORCH_NODES)]
        self.cluster: Any = None
        self.agents: list[subprocess.Popen[bytes]] = []
        self._watches: list[_LogWatch] = []
        self._injected: datetime | None = None

    def flags(self) -> list[str]:
        if self.fault is None:
            return [*TORCH_REAL_LIFE_FLAGS, f"--checkpoint-dir={self.workdir / 'checkpoints'}"]
        values = {"rank": self.rank, "step": self.step}
        return [flag.format(**values) for flag in self.fault.flags]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._launch([])
        self._watches = [_LogWatch(p) for p in self.cluster.log_paths]
        if self.fault is None:
            self._restart = threading.Thread(target=self._restart_later, name=f"restart-{self.job_id}", daemon=True)
            self._restart.start()

    def _launch(self, more: list[str]) -> None:
        """The launchers, then an agent per virtual node watching its launcher's tree."""
        from lab.evaluation.torchjob.cluster import launch

        self.cluster = launch(
            TORCH_NODES,
            TORCH_PROCS,
            job_id=self.job_id,
            log_dir=self.workdir / "job",
            extra_args=["--workers=0", f"--seed={self.seed}", *self.flags(), *more],
        )
        self.agents = []
        for node in range(TORCH_NODES):
            args = self.cluster.agent_args(
                node, server=self.url, node_name=self.node_names[node], spool_dir=self.workdir / f"spool-{node}"
            )
            self.agents.append(spawn(args, env=self._env, log=self.workdir / f"agent-{node}.log"))

    def _restart_later(self) -> None:
        """A scheduler's preemption and requeue: SIGTERM to the launchers (torchrun passes it on), the agents
        stopped with them, then everything started again from the last checkpoint."""
        if not wait_until(self.ready, timeout=TORCH_RESTART_AFTER_S * 4, cancel=self._stopping):
            return
        if self._stopping.wait(TORCH_RESTART_AFTER_S):
            return
        self._restarting.set()
        try:
            at = _now()
            for launcher in self.cluster.launchers:
                with contextlib.suppress(OSError):
                    launcher.send_signal(signal.SIGTERM)
            for launcher in self.cluster.launchers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    launcher.wait(timeout=30)
            self._stop_agents()
            self.cluster.stop()
            if self._stopping.is_set():
                return
            self._launch(["--resume"])
            self.noise.append(
                {"kind": "restart", "at": at.isoformat(), "down_s": round((_now() - at).total_seconds(), 1)}
            )
        finally:
            self._restarting.clear()

    def _stop_agents(self) -> list[Any]:
        """SIGTERM (they flush), then wait; returns their process trees as they were."""
        procs = [p for a in self.agents for p in _tree(a.pid)]
        for agent in self.agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        for agent in self.agents:
            stop(agent, timeout=10)
        return procs

    def ready(self) -> bool:
        return self.cluster is not None and bool(self.cluster.last_steps())

    def injected_at(self) -> datetime | None:
        if self._injected is None and self._marker is not None:
            for watch in self._watches:
                if any(self._marker.search(line) for line in watch.new_lines()):
                    self._injected = _now()  # seen within one poll of it happening
                    break
        return self._injected

    def failure(self) -> str | None:
        if self.cluster is None or self._injected is not None or self._restarting.is_set():
            return None  # after the fault the job may well end: that is the fault
        if all(p.poll() is not None for p in self.cluster.launchers):
            return f"the torchrun job ended before its fault; see {self.workdir / 'job'}"
        return None

    def ground_truth(self) -> GroundTruth:
        if self.fault is None:
            return GroundTruth(self.scenario, self.job_id, tuple(self.node_names), (), noise=tuple(self.noise))
        node = [self.node_names[self.rank // TORCH_PROCS]] if self.rank is not None else []
        fault = Fault(
            kind=self.fault.kind,
            nodes=tuple(node),
            injected_at=self._injected,
            blame=self.fault.blame,
            expect_eviction=self.fault.expect_eviction,
            eviction_optional=self.fault.eviction_optional,
        )
        faults = (fault,) if self._injected is not None else ()
        return GroundTruth(self.scenario, self.job_id, tuple(self.node_names), faults)

    def stop(self) -> list[str]:
        """Agents first (SIGTERM, they flush), then every process of the job (SIGKILL); then check."""
        self._stopping.set()
        if self._restart is not None:
            self._restart.join(timeout=60)
        left = reap(self._stop_agents())
        if self.cluster is not None:
            self.cluster.stop()
            left += [_describe(p) for p in self.cluster.processes()]
            for proc in self.cluster.processes():
                with contextlib.suppress(Exception):
                    os.kill(proc.pid, signal.SIGKILL)
        return left


def wait_until(predicate: Any, *, timeout: float, cancel: Any, poll: float = 0.25) -> bool:
    """Poll `predicate` until it is true (True), the timeout passes (False) or `cancel` is set (raises)."""
    deadline = time.monotonic() + timeout
    while True:
        if cancel.is_set():
            raise Cancelled
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        cancel.wait(poll)


class Cancelled(Exception):
    """The eval was interrupted (Ctrl-C or SIGTERM)."""
