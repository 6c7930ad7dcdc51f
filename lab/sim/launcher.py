"""torchrun stand-in for one simulated node (`python -m lab.sim.launcher`).

Starts the node's rank processes with torchrun's environment (its node rank from the control file: none while
the machine is a spare or in repair), so an agent watching this process finds
its workers (RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID in /proc/PID/environ). Like an
elastic agent with restarts it outlives its workers: when the control file's generation changes (the
job restarts) it stops what is left and starts fresh workers. SIGTERM stops the workers and exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from lab.sim.procs import die_with_parent, stop_all

POLL = 0.25


def _control(path: str) -> tuple[int, int | None] | None:
    """The control file's generation and this machine's node rank (None: not in the job, a spare)."""
    try:
        with open(path) as f:
            first, second = f.readline().split(), f.readline().split()
    except OSError:
        return None
    if len(first) != 2 or first[0] != "generation" or len(second) != 2 or second[0] != "node_rank":
        return None
    return int(first[1]), int(second[1]) if second[1].isdigit() else None


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _log(message: str) -> None:
    print(f"[launcher {os.getpid()}] {time.strftime('%H:%M:%S')} {message}", flush=True)


def _start_workers(args: argparse.Namespace, generation: int, node_rank: int) -> dict[int, subprocess.Popen[bytes]]:
    world = args.nnodes * args.nproc_per_node
    workers = {}
    for local in range(args.nproc_per_node):
        rank = node_rank * args.nproc_per_node + local
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local),
            GROUP_RANK=str(node_rank),
            ROLE_RANK=str(rank),
            ROLE_NAME="default",
            LOCAL_WORLD_SIZE=str(args.nproc_per_node),
            WORLD_SIZE=str(world),
            ROLE_WORLD_SIZE=str(world),
            GROUP_WORLD_SIZE=str(args.nnodes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(args.master_port),
            TORCHELASTIC_RUN_ID=args.job_id,
            TORCHELASTIC_RESTART_COUNT=str(generation),
            TORCHELASTIC_MAX_RESTARTS="100",
            TORCHELASTIC_USE_AGENT_STORE="True",
            FAULTLINE_JOB_ID=args.job_id,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            FAULTLINE_SIM_CONTROL=args.control,
            FAULTLINE_SIM_STEP_SECONDS=str(args.step_seconds),
        )
        workers[local] = subprocess.Popen(
            # -S: no site (and no editable-install finder): ~1 MB less per rank; PYTHONPATH finds `agents`.
            [sys.executable, "-S", "-m", "lab.sim.rank"],
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
            close_fds=True,
        )
    pids = "".join(f"{local} {p.pid}\n" for local, p in workers.items())
    _write_atomic(args.pids, f"generation {generation}\n{pids}")
    _log(f"generation {generation}: started ranks " + ", ".join(f"{lr}:{p.pid}" for lr, p in workers.items()))
    return workers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.sim.launcher")
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--control", required=True, help="control file written by the simulator")
    parser.add_argument("--pids", required=True, help="where to write `<local_rank> <pid>` lines")
    parser.add_argument("--step-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parent = os.getppid()
    workers: dict[int, subprocess.Popen[bytes]] = {}
    reported: set[int] = set()
    state: tuple[int, int | None] | None = None
    while not stopping and os.getppid() == parent:
        wanted = _control(args.control)
        if wanted is not None and wanted != state:  # a restart, or the machine joined or left the job
            if workers:
                stop_all(workers.values(), timeout=3.0, group=False)
            generation, node_rank = state = wanted
            workers, reported = {}, set()
            if node_rank is not None:
                workers = _start_workers(args, generation, node_rank)
            else:
                _write_atomic(args.pids, f"generation {generation}\n")
        for local, p in workers.items():
            code = p.poll()
            if code is not None and local not in reported:
                reported.add(local)
                _log(f"rank local {local} (pid {p.pid}) exited with code {code}")
        time.sleep(POLL)
    stop_all(workers.values(), timeout=3.0, group=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
