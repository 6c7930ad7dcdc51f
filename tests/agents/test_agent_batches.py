"""Which job an agent's batch names: the job whose processes run on the node; after they end, only the job's last
log lines keep it (a crash's traceback is written as its processes die), never the GPUs' samples."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

from agents.agent import Agent
from agents.config import load
from agents.events import Event
from agents.procs import ProcStat, Worker


def _agent(tmp_path: Path) -> Agent:
    flags = {"dry_run": True, "kmsg": "none", "ship_interval": 600.0, "spool_dir": tmp_path, "nvml_xid": "off"}
    return Agent(load(flags, config_file=None, environ={}), out=io.StringIO())


def _rank(job: str) -> Worker:
    stat = ProcStat(pid=4242, ppid=1, state="R", cpu_ticks=0, start_ticks=0, rss_bytes=1 << 30, name="python")
    return Worker(pid=4242, env={"RANK": "3", "LOCAL_RANK": "3"}, job_id=job, stat=stat)


def _line(text: str) -> Event:
    return Event(ts=datetime.now(UTC), source="training", kind="traceback", line=text, severity="error")


def test_the_batch_names_the_job_only_while_its_processes_run(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.workers = [_rank("llm-7")]
    agent.events = [_line("step 10")]
    running = agent.build_batch(processes=True)
    assert running["job_id"] == "llm-7" and running["processes"][0]["job_id"] == "llm-7"

    agent.workers = []  # the ranks died (or the node was evicted): the traceback they left is still the job's
    agent.events = [_line("RuntimeError: CUDA error: an illegal memory access was encountered")]
    after = agent.build_batch(processes=True)
    assert "job_id" not in after  # the GPUs' samples of a machine the job left are nobody's
    assert [e["job_id"] for e in after["logs"]] == ["llm-7"]

    agent.workers = [_rank("llm-7"), _rank("llm-8")]  # two jobs on the node: the batch names neither
    agent.events = [_line("step 11")]
    both = agent.build_batch(processes=True)
    assert "job_id" not in both and "job_id" not in both["logs"][0]
