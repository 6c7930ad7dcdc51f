"""Ingest's hook into diagnosis: a critical event gets its job a fast pass over events at once; stacks
answering a request get it a full pass (stack aggregation is part of it)."""

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
# Critical kinds judged with the job's step lines: they get a full pass at once, not the events-only one.
NEEDS_STEPS = frozenset({"nan_loss"})
# Many nodes report the same failure within a second: one diagnosis per job per this long is enough.
DEBOUNCE_MS = 500


def _default_job(batch: IngestBatch) -> str | None:
    return batch.job_id or next((p.job_id for p in batch.processes if p.job_id), None)


def jobs_with_critical_events(batch: IngestBatch, *, needing_steps: bool = False) -> set[str]:
    """External ids of the jobs this batch carries a critical event of: with `needing_steps`, only those
    whose event must be judged against the job's step lines (a NaN on one node while the others report
    finite values is that node's GPU, not the user's code), which the events-only fast pass does not read."""
    default = _default_job(batch)
    jobs = {
        e.job_id or default
        for e in batch.logs
        if (e.kind in CRITICAL_KINDS or e.severity == "critical") and (e.kind in NEEDS_STEPS) == needing_steps
    }
    return {job for job in jobs if job}


def jobs_with_stack_answers(batch: IngestBatch) -> set[str]:
    """External ids of the jobs this batch answers a stack request of."""
    default = _default_job(batch)
    return {job for job in (s.job_id or default for s in batch.stacks if s.directive_id) if job}


class DiagnosisTrigger:
    """Enqueue a pass of a job at most once per debounce interval and kind (a Redis key per job)."""

    def __init__(self, redis_url: str) -> None:
        self._redis = Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)

    def fire(self, jobs: set[str], *, full: bool = False) -> None:
        """The events fast pass, or with `full` the whole pass, of each job."""
        from service.diagnosis.tasks import diagnose_events, diagnose_job

        task, kind = (diagnose_job, "full") if full else (diagnose_events, "events")
        for job in jobs:
            try:
                if not self._redis.set(f"faultline:diagnose-soon:{kind}:{job}", 1, nx=True, px=DEBOUNCE_MS):
                    continue
                # A short countdown lets the rest of a burst (other nodes' lines of the same failure) land first.
                task.apply_async(args=[job], countdown=0.5)
            except (RedisError, OSError) as exc:
                # The periodic pass still finds it within seconds; ingest must not fail over this.
                log.warning("could not enqueue diagnosis of job %s: %s", job, exc)
