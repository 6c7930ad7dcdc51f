"""What a scale-eval scenario runs against and watches (lab/bench/scale_eval.py): the service's context,
job registration, the scheduler's long poll on decisions, the worker's diagnosis passes read from its log,
and the load generator followed on a thread."""

from __future__ import annotations

import argparse
import contextlib
import queue
import re
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from lab.bench.backend import Service, follow_load, start_load
from lab.bench.loadgen_protocol import LoadConfig

# Full passes only: a periodic pass that skipped (another was running) did no work.
_PASS_LINE = re.compile(
    r"Task diagnosis\.diagnose_job\[[^\]]+\] succeeded in ([0-9.]+)s: \{'job_id': '([^']+)'(?![^}]*'skipped': True)"
)


@dataclass
class Context:
    """What every scenario runs against."""

    args: argparse.Namespace
    service: Service
    agent_token: str
    scheduler_token: str
    run_id: str


def register_job(url: str, token: str, *, job_id: str, nodes: int, gpus_per_node: int) -> None:
    """Register the job as a scheduler does, before its agents report: one tensor-parallel group per node."""
    body = {
        "job_id": job_id,
        "world_size": nodes * gpus_per_node,
        "parallelism": {"tp": gpus_per_node, "pp": 1, "dp": nodes, "order": "tp-dp-pp"},
    }
    response = httpx.post(f"{url}/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    if response.status_code != 200:
        raise RuntimeError(f"registering job {job_id} answered {response.status_code}: {response.text[:300]}")


class DecisionWatch:
    """A scheduler's long poll on one job's decisions: each decision with the moment it was first seen."""

    def __init__(self, url: str, token: str, job_id: str) -> None:
        self.url, self.token, self.job_id = url, token, job_id
        self.seen: dict[int, tuple[float, dict[str, Any]]] = {}
        self._client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def poll(self, wait: float) -> list[dict[str, Any]]:
        """New decisions, waiting up to `wait` seconds for one."""
        params: dict[str, Any] = {"job": self.job_id, "wait": wait, "limit": 500}
        if self.seen:
            params["after"] = max(self.seen)
        try:
            response = self._client.get("/api/v1/decisions", params=params)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"the decisions API did not answer: {exc}") from None
        if response.status_code != 200:
            raise RuntimeError(f"the decisions API answered {response.status_code}: {response.text[:300]}")
        now = time.time()
        new = [item for item in response.json()["items"] if item["id"] not in self.seen]
        for item in new:
            self.seen[item["id"]] = (now, item)
        return new

    def incidents(self) -> list[dict[str, Any]]:
        """The job's incidents with their suspects."""
        from lab.evaluation.api import Api

        api = Api(self.url, self.token)
        try:
            return api.incidents(self.job_id)
        finally:
            api.close()

    def close(self) -> None:
        self._client.close()


class PassLog:
    """Diagnosis passes as the worker logs them (Celery's "succeeded in" line), read as the log grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.passes: list[tuple[str, float]] = []  # (job, seconds)

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for match in _PASS_LINE.finditer(chunk[:end].decode(errors="replace")):
            self.passes.append((match.group(2), float(match.group(1))))

    def summary(self, job_id: str) -> dict[str, Any]:
        mine = [s for job, s in self.passes if job == job_id]
        others = [s for job, s in self.passes if job != job_id]
        return {
            "count": len(mine),
            "p50_s": round(statistics.median(mine), 2) if mine else None,
            "max_s": round(max(mine), 2) if mine else None,
            "busy_s": round(sum(mine), 1),
            "other_jobs_count": len(others),
            "other_jobs_busy_s": round(sum(others), 1),
        }


class LoadRun:
    """The load generator of one scenario, followed on a thread: its events on a queue, its result at the end."""

    def __init__(self, config: LoadConfig, context: Context, stack: contextlib.ExitStack) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.process = start_load(config, stack)
        roots = context.service.cpu_roots
        self._thread = threading.Thread(target=self._follow, args=(roots,), daemon=True)
        self._thread.start()

    def _follow(self, roots: dict[str, int]) -> None:
        try:
            self.result = follow_load(self.process, roots, self.events.put)
        except (RuntimeError, ValueError) as exc:
            self.error = str(exc)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """End the paced phase (the load generator still reports), and wait for its result."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self._thread.join(timeout=120)
