"""The agent's side of a `checkpoint` directive (planned maintenance ahead): the request written where the training
side reads it, and, with checkpoint_signal, the job's processes on the node signalled (a real process here)."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import orjson

from agents.agent import Agent
from agents.config import load
from agents.procs import ProcStat, Worker

# A training process's integration, reduced to its signal handler: it saves (here: writes a file) on SIGUSR1.
HANDLER = """
import signal, sys, time
from pathlib import Path
def save(signum, frame):
    Path(sys.argv[1]).write_text("checkpoint saved")
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
time.sleep(30)
"""


def _agent(tmp_path: Path, **flags: object) -> Agent:
    base = {"dry_run": True, "kmsg": "none", "ship_interval": 600.0, "spool_dir": tmp_path / "spool", "nvml_xid": "off"}
    return Agent(load({**base, **flags}, config_file=None, environ={}), out=io.StringIO())


def _worker(pid: int, job: str) -> Worker:
    stat = ProcStat(pid=pid, ppid=1, state="S", cpu_ticks=0, start_ticks=0, rss_bytes=1 << 20, name="python")
    return Worker(pid=pid, env={"RANK": "0", "LOCAL_RANK": "0"}, job_id=job, stat=stat)


DIRECTIVE = {
    "id": "c-1",
    "kind": "checkpoint",
    "job_id": "llm-7",
    "reason": "node gpu-1: planned maintenance from 2026-11-30T02:00:00+00:00 to 2026-11-30T04:00:00+00:00: BIOS",
    "deadline": "2026-11-30T02:00:00+00:00",
}


def test_the_request_is_written_once_for_the_training_side(tmp_path: Path) -> None:
    target = tmp_path / "requests" / "checkpoint.json"
    agent = _agent(tmp_path, checkpoint_file=target)
    agent._on_directives([DIRECTIVE, DIRECTIVE])  # repeated until it expires: acted on once
    request = orjson.loads(target.read_bytes())
    assert {k: request[k] for k in ("directive_id", "job_id", "reason", "deadline")} == {
        "directive_id": "c-1",
        "job_id": "llm-7",
        "reason": DIRECTIVE["reason"],
        "deadline": DIRECTIVE["deadline"],
    }
    assert request["node"] == agent.config.node_name and not list(target.parent.glob("*.tmp"))


def test_checkpoint_signal_reaches_the_job_s_processes_only(tmp_path: Path) -> None:
    saved, other_saved = tmp_path / "saved", tmp_path / "other"
    procs = [
        subprocess.Popen([sys.executable, "-c", HANDLER, str(path)], stdout=subprocess.PIPE, text=True)
        for path in (saved, other_saved)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        agent = _agent(tmp_path, checkpoint_signal="SIGUSR1")
        agent.workers = [_worker(procs[0].pid, "llm-7"), _worker(procs[1].pid, "another-job")]
        agent._on_directives([DIRECTIVE])
        deadline = time.monotonic() + 10
        while not saved.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert saved.read_text() == "checkpoint saved"
        assert not other_saved.exists()  # another job's process is left alone
        assert agent.config.checkpoint_path.exists()  # the default file: beside the spool
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
