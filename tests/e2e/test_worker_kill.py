"""Drill: the Celery worker is SIGKILLed just as a fatal Xid arrives, with the task carrying it in hand.

`faultline demo` restarts the worker (as systemd or compose would), the task it held stays unacknowledged
in Redis, and the periodic pass finds the Xid among the job's recent events: the Xid is decided exactly
once, one incident and one eviction, and nothing more when the lost task comes back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from service.embedded import free_port
from service.processes import healthy
from tests.factories import batch
from tests.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _worker(demo: subprocess.Popen[bytes]) -> psutil.Process:
    """The demo's Celery worker (not beat): the `faultline work` child without --beat-only."""
    for child in psutil.Process(demo.pid).children():
        cmdline = child.cmdline()
        if "work" in cmdline and "--beat-only" not in cmdline:
            return child
    raise AssertionError("no worker among the demo's children")


def _kill_tree(process: psutil.Process) -> None:
    """SIGKILL a worker and its pool processes at once, as the OOM killer or a node reboot would."""
    for p in [*process.children(recursive=True), process]:
        p.send_signal(signal.SIGKILL)


def test_a_worker_killed_as_a_fatal_xid_arrives_is_restarted_and_the_xid_decided_once(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen(
        [sys.executable, "-m", "faultline", "demo", "--no-sim", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    # A loaded machine (a demo starting next to other tests) can take seconds to answer.
    http = httpx.Client(base_url=url, timeout=30)
    try:
        wait_for(lambda: demo.poll() is None and healthy(url), timeout=120, what="the demo")
        wait_for(lambda: (data_dir / "demo-tokens.json").exists(), what="the demo's tokens")
        tokens = json.loads((data_dir / "demo-tokens.json").read_text())
        agent = {"Authorization": f"Bearer {tokens['agent']}"}
        scheduler = {"Authorization": f"Bearer {tokens['scheduler']}"}
        worker = _worker(demo)
        wait_for(lambda: "ready" in (data_dir / "logs" / "worker.log").read_text(), what="the worker")

        healthy_batch = batch("gpu-node-007", job_id="drill-job", logs=[])
        assert http.post("/api/v1/ingest", json=healthy_batch, headers=agent).status_code == 200
        assert (
            httpx.post(
                f"{url}/api/v1/ingest", json=batch("gpu-node-007", job_id="drill-job"), headers=agent
            ).status_code
            == 200
        )
        _kill_tree(worker)  # the fast pass is queued with a 0.5 s countdown: the worker holds it now
        killed = time.monotonic()

        def restarted() -> bool:
            return "worker exited with code -9; restarted it" in (tmp_path / "demo.log").read_text()

        wait_for(restarted, timeout=30, what="the demo to restart the worker")
        assert demo.poll() is None, "the demo must survive its worker's death"

        def decisions() -> list[dict]:
            page = http.get("/api/v1/decisions", params={"job": "drill-job"}, headers=scheduler).json()
            return page["items"]

        wait_for(lambda: bool(decisions()), timeout=90, what="the Xid's decision after the restart")
        print(f"decided {time.monotonic() - killed:.1f} s after the worker was killed")
        time.sleep(12)  # more periodic passes, and any duplicate would show
        (decision,) = decisions()
        assert decision["kind"] == "evict" and decision["node"] == "gpu-node-007"
        incidents = http.get("/api/v1/incidents", params={"job": "drill-job"}, headers=scheduler).json()
        assert len(incidents["items"]) == 1
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            demo.kill()
        log.close()
        http.close()
