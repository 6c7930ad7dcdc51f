"""Runs a simulated cluster for real: the exporter endpoint, the log files, the launcher and rank
processes, the agents, the scenario timeline, and a clean shutdown.

Layout under `--dir`:
    ground_truth.json
    node-000/kern.log  train.log  control  ranks.pids  launcher.log  agent.log  spool/
             sys/  proc/   the node's fake kernel tree (lab/sim/kerneltree.py), the agent's sysfs/procfs roots
             gpu-state.json  what its GPUs answer the agent's checks through fake NVML and PyTorch
                             (lab/sim/gpuanswers.py, lab/sim/fakegpu)
             gpu-inventory.json  what its NVML answers without measuring: its GPUs, their NVLink fabric

The kernel trees live in shared memory (/dev/shm) where there is one, `sys` and `proc` then being links to it:
some fifty small files change per node every second, which costs ~8x less on tmpfs than on a disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any, TextIO

import agents
from lab.sim import gpustate
from lab.sim.config import SimConfig
from lab.sim.exporter import MetricsServer
from lab.sim.gpuanswers import GpuAnswers
from lab.sim.kerneltree import NodeTree, TreeWriter
from lab.sim.model import Cluster, LogLine
from lab.sim.procs import signal_group, spawn, stop_all
from lab.sim.realism import START, AgentAction
from lab.sim.scenarios import SCENARIOS
from lab.sim.scheduler import SchedulerStandIn

LOOP_SECONDS = 0.2
TREE_SECONDS = 1.0  # the kernel trees are brought up to date at most this often
SHARED_MEMORY = Path("/dev/shm")
SHM_PREFIX = "faultline-sim-"  # then the simulator's pid: a tree whose simulator died (SIGKILL) is removed
# Room a node's tree takes in memory, with a margin: ~640 small files, a page each.
TREE_BYTES_PER_NODE = 8 << 20
_NODE_FILES = (
    "kern.log", "train.log", "control", "ranks.pids", "launcher.log", "agent.log",
    gpustate.STATE_FILE, gpustate.STATE_FILE + gpustate.ASKED_SUFFIX, gpustate.INVENTORY_FILE,
)  # fmt: skip
_TREE_ROOTS = ("sys", "proc")
# Where the sitecustomize that skews an agent's wall clock lives (realism's clock skew).
SKEW_CLOCK_DIR = Path(__file__).resolve().parent / "skewclock"
# The simulated node's GPU libraries (fake pynvml and torch) and tools (dcgmi), first on its agent's paths.
FAKE_GPU_DIR = Path(__file__).resolve().parent / "fakegpu"
REPO_ROOT = Path(agents.__file__).resolve().parent.parent  # the fakes import the lab


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class SimRunner:
    def __init__(self, config: SimConfig, *, out: TextIO | None = None, stop: threading.Event | None = None) -> None:
        self.config = config
        self.out = out or sys.stdout
        self.stop = stop or threading.Event()
        self.dir = Path(config.dir)
        self.cluster: Cluster | None = None
        self.server: MetricsServer | None = None
        self.launchers: dict[int, subprocess.Popen[bytes]] = {}
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self._logs: dict[tuple[str, str], IO[str]] = {}
        self._proc_logs: list[IO[bytes]] = []
        self._pid_keys: dict[int, tuple[int, int, int]] = {}
        self._control_version = -1
        self._faults_version = -1
        self._faults_reported = 0
        self._noise_reported = 0
        self._transients_reported = 0
        self._repairs_reported: set[int] = set()
        self._agents_reported: set[int] = set()
        self.scheduler: SchedulerStandIn | None = None
        self._slots_version = 0
        self._loop_reported = 0
        self._first_step = 0
        self._t0 = 0.0
        self._trees: list[tuple[NodeTree, TreeWriter]] = []
        self._tree_at = -TREE_SECONDS
        self._tree_shm: Path | None = None
        self.tree_stats = {"syncs": 0, "files": 0, "seconds": 0.0}
        self.answers: GpuAnswers | None = None

    # --- lifecycle ---

    def run(self, *, handle_signals: bool = True) -> int:
        restore = self._install_signals() if handle_signals else {}
        started = time.monotonic()
        try:
            self._start()
            self._loop()
        finally:
            self._shutdown()
            for sig, handler in restore.items():
                signal.signal(sig, handler)
        self._summary(time.monotonic() - started)
        return 0

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop.set()

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # Model time 0 is now: log timestamps then match the wall clock the agents see.
        config = replace(self.config.resolved(), start=datetime.now().astimezone())
        self.config = config
        self._t0 = time.monotonic()
        cluster = self.cluster = Cluster(config)
        config = self.config = cluster.config  # as the scenario shaped it (an NVL72 rack: 4 GPUs a tray)
        self._first_step = cluster.job.step
        self._say(
            f"scenario {config.scenario}, job {config.job_id}, {config.nodes} nodes x {config.gpus_per_node} GPUs, "
            f"seed {config.seed}, files in {self.dir}"
        )
        for name in cluster.node_names:
            node_dir = self.dir / name
            (node_dir / "spool").mkdir(parents=True, exist_ok=True)
            for fname in _NODE_FILES:
                (node_dir / fname).unlink(missing_ok=True)  # a fresh run: agents must not read an old one
            for stream in ("kern", "train"):
                self._logs[(name, stream)] = open(node_dir / f"{stream}.log", "a", encoding="utf-8")  # noqa: SIM115
        self._write_ground_truth()
        self._sync_control()
        self._make_trees()
        if config.scheduler_token and config.server:
            self.scheduler = SchedulerStandIn(
                config.server,
                config.scheduler_token,
                job_id=str(config.job_id),
                nodes=cluster.node_names,
                say=self._say,
            )
            self.scheduler.register(cluster.rank_map(), cluster.world)  # as the job's launcher would at its start
            self.scheduler.start()
            spares = ", ".join(cluster.spares_free()) or "none"
            self._say(f"scheduler stand-in acting on evict, diagnose, reset_gpu, cordon, return; spares: {spares}")
        self.server = MetricsServer(config.host, config.port)
        self.server.publish(cluster.snapshot())
        self.server.start()

        if config.agents:
            self.answers = GpuAnswers(
                cluster, self.dir, check_seconds=config.check_seconds, sync_tree=self._sync_tree, say=self._say
            )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        master_port = 29500 + (config.seed or 0) % 1000
        for n, name in enumerate(cluster.node_names):
            node_dir = self.dir / name
            log = open(node_dir / "launcher.log", "ab")  # noqa: SIM115
            self._proc_logs.append(log)
            # The launcher's own environment is torchrun's: no RANK, only the workers get it.
            self.launchers[n] = spawn(
                [
                    sys.executable, "-m", "lab.sim.launcher",
                    "--nnodes", str(config.nodes),
                    "--nproc-per-node", str(config.gpus_per_node), "--job-id", str(config.job_id),
                    "--master-port", str(master_port), "--control", str((node_dir / "control").resolve()),
                    "--pids", str((node_dir / "ranks.pids").resolve()), "--step-seconds", str(config.step_seconds),
                ],
                env=env,
                stdout=log,
            )  # fmt: skip
            cluster.launcher_pids[n] = self.launchers[n].pid
        for n, name in enumerate(cluster.node_names):
            if config.agents and cluster.agent_delay(n) <= 0:  # a late node's agent starts when the model says
                self._start_agent(n, name)
            agent = f", agent pid {self.agents[n].pid}" if n in self.agents else ""
            ranks = cluster.ranks_on(n)
            role = f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "spare"
            self._say(f"{name} up: {self.server.url(name)}, launcher pid {self.launchers[n].pid} ({role}){agent}")

    def _start_agent(self, n: int, name: str) -> None:
        config = self.config
        node_dir = (self.dir / name).resolve()
        assert self.server is not None
        if SCENARIOS[config.scenario].metrics_only:
            # dcgm-exporter alone: no kernel log, no training log, no training process.
            sources = ["--kmsg", "none", "--no-processes"]
        else:
            sources = [
                "--kmsg", str(node_dir / "kern.log"), "--log", str(node_dir / "train.log"),
                "--watch-pid", str(self.launchers[n].pid),
            ]  # fmt: skip
        command = [
            *config.agent_command,
            "--server", str(config.server), "--node-name", name,
            "--interval", str(config.interval), "--dcgm-url", self.server.url(name),
            *sources, "--spool-dir", str(node_dir / "spool"),
        ]  # fmt: skip
        if config.sample_interval is not None:
            command += ["--sample-interval", str(config.sample_interval)]
        command += ["--sysfs-root", str(node_dir / "sys"), "--procfs-root", str(node_dir / "proc")]
        if self.cluster is not None:  # where the machine sits, as its operator labels it (lab/sim/shared_faults.py)
            place = self.cluster.location(n)
            command += [f"--node-label={k}={place[k]}" for k in ("rack", "switch", "power_domain")]
            command += [f"--storage-mount={m}" for m in place["storage_mounts"]]
        log = open(node_dir / "agent.log", "ab")  # noqa: SIM115
        self._proc_logs.append(log)
        # The token goes in the environment: command lines are visible to every user in `ps`.
        env = {**os.environ, "FAULTLINE_AGENT_TOKEN": str(config.token)}
        # Its GPUs: the fake libraries answer the agent's checks from the machine's state (lab/sim/gpuanswers.py).
        paths = [str(FAKE_GPU_DIR), str(REPO_ROOT)]
        env["PATH"] = os.pathsep.join(p for p in (str(FAKE_GPU_DIR / "bin"), env.get("PATH")) if p)
        env[gpustate.ENV] = str(node_dir / gpustate.STATE_FILE)
        skew = self.cluster.skew[n].total_seconds() if self.cluster else 0.0
        if skew:  # the node's clock is off: so is its agent's
            paths.insert(0, str(SKEW_CLOCK_DIR))
            env["FAULTLINE_SIM_CLOCK_SKEW_S"] = str(skew)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, env.get("PYTHONPATH")) if p)
        self.agents[n] = spawn(command, env=env, stdout=log)
        self._agents_reported.discard(n)

    def _loop(self) -> None:
        duration = self.config.duration
        while not self.stop.is_set():
            elapsed = time.monotonic() - self._t0
            self._tick(elapsed)
            if duration is not None and elapsed >= duration:
                break
            self.stop.wait(LOOP_SECONDS)

    def _tick(self, elapsed: float) -> None:
        cluster = self.cluster
        assert cluster is not None and self.server is not None
        self._read_pids()
        self._write_lines(cluster.advance(elapsed))
        self._sync_control()
        self.server.publish(cluster.snapshot())
        if elapsed - self._tree_at >= TREE_SECONDS:
            self._tree_at = elapsed
            self._sync_trees()
        if cluster.faults_version != self._faults_version:
            self._faults_version = cluster.faults_version
            self._write_ground_truth()
            self._report_faults()
        for action in cluster.take_agent_actions():
            self._act_on_agent(action)
        self._check_agents()
        if self.answers is not None:
            self.answers.tick(elapsed)
        if self.scheduler is not None:
            for decision, outcome in self.scheduler.backend.serve(cluster):
                what = f"{decision.get('kind')} {decision.get('node')}"
                self._say(f"t={cluster.t:.1f}s scheduler: {what}: {outcome.ack}, {outcome.message}")
            if cluster.slots_version != self._slots_version:
                self._slots_version = cluster.slots_version
                self.scheduler.register(cluster.rank_map(), cluster.world)

    def _act_on_agent(self, action: AgentAction) -> None:
        """Realism: a late node's agent starts, or an agent is stopped (TERM or KILL) and later started again;
        its spool folder stays, so what it had not shipped goes out after the restart."""
        if not self.config.agents:
            return
        name = self.cluster.node_names[action.node] if self.cluster else str(action.node)
        if action.action == START:
            if action.node not in self.agents or self.agents[action.node].poll() is not None:
                self._start_agent(action.node, name)
                self._say(f"t={action.t:.1f}s agent of {name} started (pid {self.agents[action.node].pid})")
            return
        proc = self.agents.pop(action.node, None)
        if proc is None:
            return
        signal_group(proc, signal.SIGKILL if action.signal == "KILL" else signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        if proc.poll() is None:
            signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=2.0)
        self._say(f"t={action.t:.1f}s agent of {name} stopped with SIG{action.signal}")

    def _shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        # Agents first (they may want to flush), then the launchers with their ranks, in parallel within each.
        stop_all(self.agents.values(), timeout=5.0)
        stop_all(self.launchers.values(), timeout=5.0)
        if self.server is not None:
            self.server.stop()
        for f in [*self._logs.values(), *self._proc_logs]:
            with contextlib.suppress(OSError):
                f.close()
        if self._tree_shm is not None:  # the links in the node folders go with it: nothing left in memory
            for name in self.cluster.node_names if self.cluster else ():
                for root in _TREE_ROOTS:
                    (self.dir / name / root).unlink(missing_ok=True)
            shutil.rmtree(self._tree_shm, ignore_errors=True)

    # --- kernel trees ---

    def _make_trees(self) -> None:
        """A fresh fake kernel tree per node, in shared memory when there is some, written once before any agent."""
        cluster = self.cluster
        assert cluster is not None
        if _room_in(SHARED_MEMORY, TREE_BYTES_PER_NODE * len(cluster.node_names)):
            _remove_orphan_trees(SHARED_MEMORY)
            self._tree_shm = Path(tempfile.mkdtemp(prefix=f"{SHM_PREFIX}{os.getpid()}-", dir=SHARED_MEMORY))
        for n, name in enumerate(cluster.node_names):
            node_dir = self.dir / name
            for root in _TREE_ROOTS:  # a previous run's tree, a folder or a link
                path = node_dir / root
                if path.is_symlink() or path.is_file():
                    path.unlink()
                elif path.is_dir():
                    shutil.rmtree(path)
            base = node_dir
            if self._tree_shm is not None:
                base = self._tree_shm / name
                for root in _TREE_ROOTS:
                    (base / root).mkdir(parents=True)
                    (node_dir / root).symlink_to(base / root, target_is_directory=True)
            tree, writer = NodeTree(name, cluster.hosts[n], cluster.fabrics[n], cluster.gpus[n]), TreeWriter(base)
            writer.sync(tree.files())
            self._trees.append((tree, writer))

    def _sync_tree(self, machine: int) -> None:
        """One node's tree brought up to date now (its ports' counters changed under its checks' traffic)."""
        tree, writer = self._trees[machine]
        writer.sync(tree.files())

    def _sync_trees(self) -> None:
        started = time.perf_counter()
        written = sum(writer.sync(tree.files()) for tree, writer in self._trees)
        stats = self.tree_stats
        stats["syncs"] += 1
        stats["files"] += written
        stats["seconds"] += time.perf_counter() - started

    # --- files ---

    def _write_lines(self, lines: list[LogLine]) -> None:
        touched = set()
        for line in lines:
            f = self._logs[(line.node, line.stream)]
            f.write(line.text + "\n")
            touched.add(f)
        for f in touched:
            f.flush()

    def _sync_control(self) -> None:
        cluster = self.cluster
        assert cluster is not None
        if cluster.control_version == self._control_version:
            return
        self._control_version = cluster.control_version
        for n, name in enumerate(cluster.node_names):
            _write_atomic(self.dir / name / "control", cluster.control_text(n))

    def _read_pids(self) -> None:
        """Tell the model the real rank pids (they appear in NCCL lines and torchrun summaries)."""
        cluster = self.cluster
        assert cluster is not None
        for n, name in enumerate(cluster.node_names):
            path = self.dir / name / "ranks.pids"
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._pid_keys.get(n) == key:
                continue
            self._pid_keys[n] = key
            pids = {}
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    pids[int(parts[0])] = int(parts[1])
            cluster.set_pids(n, pids)

    def _write_ground_truth(self) -> None:
        assert self.cluster is not None
        _write_atomic(self.dir / "ground_truth.json", json.dumps(self.cluster.ground_truth(), indent=2) + "\n")

    # --- reporting ---

    def _say(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"sim: {message}", file=self.out, flush=True)

    def _report_faults(self) -> None:
        cluster = self.cluster
        assert cluster is not None
        for i, fault in enumerate(cluster.faults):
            if i >= self._faults_reported:
                details = fault.details or {}
                where = (
                    ", ".join(f"{n} gpu {','.join(map(str, g))}" for n, g in fault.gpus.items())
                    or ", ".join(fault.nodes)
                    or (  # an NVL72 rack's switch tray: the domain's fault, felt on every tray
                        f"{details['switch_tray']} (NVLink domain {details['nvlink_domain']}, "
                        f"{len(details['trays'])} trays)"
                        if "switch_tray" in details
                        else "all ranks"
                    )
                )
                ranks = f" (rank {', '.join(map(str, fault.ranks))})" if fault.ranks else ""
                evict = "expect eviction" if fault.expect_eviction else "no eviction"
                self._say(f"t={fault.t:.1f}s injected {fault.kind} on {where}{ranks}; blame {fault.blame}, {evict}")
            if fault.repaired_at is not None and i not in self._repairs_reported:
                self._repairs_reported.add(i)
                where = ", ".join(fault.nodes) or "the job"
                how = {
                    "evict": "in the repair shop, after its eviction",
                    "diagnose": "in the repair shop, after its check",
                    "reset_gpu": "by the GPU reset",
                }.get(fault.resolved_by, "by the scenario; job restarted")
                self._say(f"repaired {fault.kind} on {where} {how}")
        self._faults_reported = len(cluster.faults)
        for event in cluster.loop_events[self._loop_reported :]:
            detail = f" ({event.detail})" if event.detail else ""
            self._say(f"t={event.t:.1f}s loop: {event.kind} {event.node}{detail}")
        self._loop_reported = len(cluster.loop_events)
        # Realism's job events (the agents' own are said as the runner acts on them).
        events = cluster.real.events if cluster.real is not None else []
        for event in events[self._noise_reported :]:
            if not event["kind"].startswith("agent_"):
                details = ", ".join(f"{k} {v}" for k, v in event.items() if k not in ("kind", "t", "at"))
                self._say(f"t={event['t']:.1f}s noise: {event['kind']} ({details})")
        self._noise_reported = len(events)
        for noise in cluster.noise[self._transients_reported :]:
            where = ", ".join(noise["nodes"])
            self._say(f"noise: {noise['kind']} ({noise.get('variant', '')}) on {where}; nothing to find or evict")
        self._transients_reported = len(cluster.noise)

    def _check_agents(self) -> None:
        for n, p in self.agents.items():
            code = p.poll()
            if code is not None and n not in self._agents_reported:
                self._agents_reported.add(n)
                name = self.cluster.node_names[n] if self.cluster else str(n)
                self._say(f"agent of {name} exited with code {code}; see {self.dir / name / 'agent.log'}")

    def _summary(self, seconds: float) -> None:
        cluster = self.cluster
        if cluster is None:
            return
        faults = ", ".join(f"{f.kind}@{','.join(f.nodes) or 'job'}" for f in cluster.faults) or "none"
        self._say(
            f"stopped after {seconds:.1f} s: job {cluster.job.state} at step {cluster.job.step} "
            f"({cluster.job.step - self._first_step} steps), faults: {faults}; "
            f"ground truth in {self.dir / 'ground_truth.json'}"
        )
        syncs = max(1, int(self.tree_stats["syncs"]))
        self._say(
            f"kernel trees: {self.tree_stats['files'] / syncs:.0f} files written per update, "
            f"{1000 * self.tree_stats['seconds'] / syncs:.1f} ms per update ({syncs} updates)"
        )


def _room_in(folder: Path, needed: int) -> bool:
    """Whether `folder` is a writable directory with `needed` bytes free (a container's /dev/shm may be 64 MiB)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return os.access(folder, os.W_OK) and st.f_bavail * st.f_frsize >= needed


def _remove_orphan_trees(folder: Path) -> None:
    """Remove the trees of simulators that died without cleaning up (killed outright)."""
    for path in folder.glob(f"{SHM_PREFIX}*-*"):
        pid = path.name.removeprefix(SHM_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def run_sim(
    config: SimConfig,
    *,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
    handle_signals: bool | None = None,
) -> int:
    """Run a simulated cluster until `config.duration`, SIGINT/SIGTERM, or `stop` is set. Returns 0.

    With a `stop` event the caller owns shutdown and signal handlers are left alone (unless asked).
    """
    if config.agents and not (config.server and config.token):
        raise ValueError("agents need --server and --token (or FAULTLINE_AGENT_TOKEN); or pass --no-agents")
    runner = SimRunner(config, out=out, stop=stop)
    return runner.run(handle_signals=stop is None if handle_signals is None else handle_signals)
