"""Launch `train.py` as a real multi-node torchrun job on one host: one torchrun launcher per virtual node.

    with launch(2, 2, job_id="job-1", log_dir=tmp_path, extra_args=["--hang-rank", "3"]) as cluster:
        cluster.wait_for_step(3)
        cluster.rank_pids()  # {0: pid, 1: pid, 2: pid, 3: pid}

Each launcher writes its stdout and stderr (the ranks' lines, prefixed `[rankN]:` by torchrun's --tee, and
torchrun's own messages such as the ChildFailedError summary) to `log_dir/node-K.log`, like a real node's log.

This module must not import torch: the calling process (eval, a test) only launches and watches the job.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL, STDOUT, Popen, TimeoutExpired
from types import TracebackType
from typing import IO

import psutil

TRAIN_SCRIPT = Path(__file__).with_name("train.py")

# torchrun's --tee prefixes every line of a rank with this; `${rank}` is the global rank.
LOG_LINE_PREFIX_TEMPLATE = "[rank${rank}]:"
STEP_LINE = re.compile(
    r"^\[rank(?P<rank>\d+)\]:step=(?P<step>\d+) loss=(?P<loss>\S+) grad_norm=(?P<grad_norm>\S+)"
    r" elapsed_ms=(?P<elapsed_ms>[0-9.]+)\s*$"
)

# Variables of an enclosing torchrun (if the caller itself runs under one) would confuse the launchers.
_INHERITED_DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@dataclass(frozen=True, slots=True)
class RankProc:
    """A rank's training process, as its environment (set by torchrun) describes it."""

    rank: int
    local_rank: int
    group_rank: int
    world_size: int
    pid: int
    node: int  # index of the launcher whose process tree it is in


@dataclass(frozen=True, slots=True)
class Step:
    """One parsed progress line."""

    node: int
    rank: int
    step: int
    loss: float
    grad_norm: float
    elapsed_ms: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun_command() -> list[str]:
    # Prefer the `torchrun` script next to this interpreter, so the launcher's command line says torchrun
    # (as on a real node, where an agent may look for it); fall back to the module.
    script = Path(sys.executable).parent / "torchrun"
    if script.exists():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "torch.distributed.run"]


class TorchCluster:
    """The launchers of one job, their logs, and the ranks under them."""

    def __init__(
        self,
        *,
        job_id: str,
        nodes: int,
        procs_per_node: int,
        port: int,
        log_dir: Path,
        launchers: list[Popen[bytes]],
        log_paths: list[Path],
        log_files: list[IO[bytes]],
    ) -> None:
        self.job_id = job_id
        self.nodes = nodes
        self.procs_per_node = procs_per_node
        self.port = port
        self.log_dir = log_dir
        self.launchers = launchers
        self.log_paths = log_paths
        self._log_files = log_files
        self._stopped = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def agent_args(self, node: int, *, server: str, node_name: str, spool_dir: Path) -> list[str]:
        """`faultline agent` watching one virtual node: its launcher's process tree and its log."""
        return [
            "faultline", "agent", "--server", server, "--node-name", node_name, "--interval", "1",
            "--kmsg", "none", "--log", str(self.log_paths[node]), "--watch-pid", str(self.launchers[node].pid),
            "--job-env", "FAULTLINE_JOB_ID", "--spool-dir", str(spool_dir), "--stack-timeout", "20",
        ]  # fmt: skip

    # -- logs -------------------------------------------------------------------------------------------

    def log_text(self, node: int) -> str:
        try:
            return self.log_paths[node].read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def logs(self, tail: int = 4000) -> str:
        """The end of every node's log, for assertion messages."""
        return "\n".join(f"--- node-{k}.log ---\n{self.log_text(k)[-tail:]}" for k in range(self.nodes))

    def steps(self) -> list[Step]:
        """Every progress line printed so far, in log order per node."""
        out: list[Step] = []
        for node in range(self.nodes):
            for line in self.log_text(node).splitlines():
                m = STEP_LINE.match(line)
                if m:
                    out.append(
                        Step(
                            node=node,
                            rank=int(m["rank"]),
                            step=int(m["step"]),
                            loss=float(m["loss"]),
                            grad_norm=float(m["grad_norm"]),
                            elapsed_ms=float(m["elapsed_ms"]),
                        )
                    )
        return out

    def last_steps(self) -> dict[int, int]:
        """Rank -> the last step it reported."""
        last: dict[int, int] = {}
        for s in self.steps():
            last[s.rank] = max(s.step, last.get(s.rank, 0))
        return last

    def wait_for_step(self, step: int, timeout: float = 60.0, ranks: list[int] | None = None) -> dict[int, int]:
        """Wait until every rank (or those given) has reported `step`; fail early if a launcher exits."""
        wanted = list(range(self.world_size)) if ranks is None else ranks
        deadline = time.monotonic() + timeout
        while True:
            last = self.last_steps()
            if all(last.get(r, 0) >= step for r in wanted):
                return last
            exited = [k for k, p in enumerate(self.launchers) if p.poll() is not None]
            if exited:
                codes = {k: self.launchers[k].returncode for k in exited}
                raise RuntimeError(f"launcher(s) exited {codes} before step {step} (last: {last})\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no step {step} on ranks {wanted} after {timeout} s (last: {last})\n{self.logs()}")
            time.sleep(0.2)

    def wait_exited(self, timeout: float = 60.0) -> list[int]:
        """Wait until every launcher has exited; return their exit codes."""
        deadline = time.monotonic() + timeout
        codes: list[int] = []
        for p in self.launchers:
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutExpired:
                raise TimeoutError(f"launchers still running after {timeout} s\n{self.logs()}") from None
        return codes

    # -- processes ----------------------------------------------------------------------------------------

    def _tree(self, node: int) -> list[psutil.Process]:
        try:
            launcher = psutil.Process(self.launchers[node].pid)
            return [launcher, *launcher.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rank_procs(self) -> dict[int, RankProc]:
        """Rank -> its process, found like an agent would: RANK and FAULTLINE_JOB_ID in /proc/PID/environ."""
        out: dict[int, RankProc] = {}
        for node in range(self.nodes):
            for proc in self._tree(node):
                env = _environ(proc)
                if env.get("FAULTLINE_JOB_ID") != self.job_id or "RANK" not in env:
                    continue
                # DataLoader workers inherit their rank's environment: the rank is the top-most process with it.
                with contextlib.suppress(psutil.Error):
                    parent = proc.parent()
                    if parent is not None and _environ(parent).get("RANK") == env["RANK"]:
                        continue
                out[int(env["RANK"])] = RankProc(
                    rank=int(env["RANK"]),
                    local_rank=int(env["LOCAL_RANK"]),
                    group_rank=int(env["GROUP_RANK"]),
                    world_size=int(env["WORLD_SIZE"]),
                    pid=proc.pid,
                    node=node,
                )
        return dict(sorted(out.items()))

    def rank_pids(self) -> dict[int, int]:
        """Rank -> pid of its training process."""
        return {rank: p.pid for rank, p in self.rank_procs().items()}

    def wait_for_ranks(self, timeout: float = 30.0) -> dict[int, RankProc]:
        """Wait until every rank's process exists (torchrun starts them after rendezvous)."""
        deadline = time.monotonic() + timeout
        while True:
            procs = self.rank_procs()
            if len(procs) == self.world_size or time.monotonic() > deadline:
                return procs
            time.sleep(0.2)

    def processes(self) -> list[psutil.Process]:
        """Every live process of the job: the launchers' trees plus strays that carry the job id."""
        seen: dict[int, psutil.Process] = {}
        for node in range(self.nodes):
            for proc in self._tree(node):
                seen[proc.pid] = proc
        # Ranks live in their own sessions (torchrun's start_new_session) and are re-parented when a
        # launcher dies, so also look for anything carrying the job id.
        for proc in psutil.process_iter():
            if proc.pid not in seen and _environ(proc).get("FAULTLINE_JOB_ID") == self.job_id:
                seen[proc.pid] = proc
        seen.pop(os.getpid(), None)
        return list(seen.values())

    def kill_node(self, node: int, sig: int = signal.SIGKILL) -> None:
        """Signal a node's whole tree: its launcher's and every rank's process group."""
        _signal_groups(self._tree(node), sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Kill every process of the job (SIGKILL, by process group), even hung ones, and reap the launchers."""
        procs = self.processes()
        _signal_groups(procs, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for p in self.launchers:
            with contextlib.suppress(TimeoutExpired):
                p.wait(timeout=timeout)
        psutil.wait_procs(procs, timeout=timeout)
        for f in self._log_files:
            f.close()
        self._stopped = True

    def __enter__(self) -> TorchCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def _signal_groups(procs: list[psutil.Process], sig: int) -> None:
    own = os.getpgrp()
    groups: set[int] = set()
    for proc in procs:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(proc.pid))
    groups.discard(own)  # never signal the calling process's own group
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)


_live: weakref.WeakSet[TorchCluster] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    # A caller that forgot to stop its cluster (or an interrupted run) must not leave a hung job behind.
    for cluster in list(_live):
        if not cluster._stopped:
            cluster.stop(timeout=2)


def launch(
    nodes: int,
    procs_per_node: int,
    *,
    job_id: str,
    log_dir: Path,
    extra_args: list[str],
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> TorchCluster:
    """Start one torchrun launcher per virtual node (static rendezvous on 127.0.0.1); returns at once."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in _INHERITED_DIST_VARS}
    child_env.update(
        {
            "FAULTLINE_JOB_ID": job_id,
            "OMP_NUM_THREADS": "1",  # 4 ranks on 2 cores: no thread oversubscription
            "PYTHONUNBUFFERED": "1",  # the launcher's output goes to a file; lines must land as they happen
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_LINE_PREFIX_TEMPLATE,
            # All virtual nodes share the host: make gloo use loopback, whatever the hostname resolves to.
            "GLOO_SOCKET_IFNAME": "lo",
            **(env or {}),
        }
    )
    launchers: list[Popen[bytes]] = []
    log_paths: list[Path] = []
    log_files: list[IO[bytes]] = []
    for node in range(nodes):
        command = [
            *_torchrun_command(),
            f"--nnodes={nodes}",
            f"--nproc-per-node={procs_per_node}",
            f"--node-rank={node}",
            "--rdzv-backend=static",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--max-restarts=0",
            "--tee=3",
            f"--log-dir={log_dir / f'torchrun-node-{node}'}",
            str(TRAIN_SCRIPT),
            *extra_args,
        ]
        log_path = log_dir / f"node-{node}.log"
        log_file = log_path.open("ab")
        # Own session per launcher so a node's tree can be signalled without touching the calling process.
        launchers.append(
            Popen(command, stdin=DEVNULL, stdout=log_file, stderr=STDOUT, env=child_env, start_new_session=True)
        )
        log_paths.append(log_path)
        log_files.append(log_file)
    cluster = TorchCluster(
        job_id=job_id,
        nodes=nodes,
        procs_per_node=procs_per_node,
        port=port,
        log_dir=log_dir,
        launchers=launchers,
        log_paths=log_paths,
        log_files=log_files,
    )
    _live.add(cluster)
    return cluster
