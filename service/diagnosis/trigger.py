"""Ingest's hook into diagnosis: a critical event (or stacks answering a request) diagnoses its job at once."""

from __future__ import annotations

import logging

from redis import Redis
from redis.exceptions import RedisError

from service.ingest.schemas import IngestBatch

log = logging.getLogger(__name__)

# Event kinds that cannot wait for the next periodic pass.
CRITICAL_KINDS = frozenset(
    {
        "xid",
        "sxid",
        "traceback",
        "child_failed",
        "crash",
        "cuda_error",
        "cpp_exception",
        "ib_error",
        "nccl_error",
        "watchdog_timeout",
        "collective_timeout",
        "oom",
        "dataloader_died",
        "nan_loss",
    }
)
# Many nodes report the same failure within a second: one diagnosis per job per this long is enough.
DEBOUNCE_MS = 500


def jobs_to_diagnose(batch: IngestBatch) -> set[str]:
    """External ids of the jobs this batch carries urgent news for."""
    jobs: set[str] = set()
    default = batch.job_id or next((p.job_id for p in batch.processes if p.job_id), None)
    for event in batch.logs:
        if event.kind in CRITICAL_KINDS or event.severity == "critical":
            job = event.job_id or default
            if job:
                jobs.add(job)
    for stack in batch.stacks:
        if stack.directive_id:
            job = stack.job_id or default
            if job:
                jobs.add(job)
    return jobs


class DiagnosisTrigger:
    """Enqueue diagnose_job for a job at most once per debounce interval (a Redis key per job)."""

    def __init__(self, redis_url: str) -> None:
        self._redis = Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)

    def fire(self, jobs: set[str]) -> None:
        from service.diagnosis.tasks import diagnose_job

        for job in jobs:
            try:
                if not self._redis.set(f"faultline:diagnose-soon:{job}", 1, nx=True, px=DEBOUNCE_MS):
                    continue
                # A short countdown lets the rest of a burst (other nodes' lines of the same failure) land first.
                diagnose_job.apply_async(args=[job], countdown=0.5)
            except (RedisError, OSError) as exc:
                # The periodic pass still finds it within seconds; ingest must not fail over this.
                log.warning("could not enqueue diagnosis of job %s: %s", job, exc)
