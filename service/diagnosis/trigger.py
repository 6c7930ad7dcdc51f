"""Ingest's hook into diagnosis: a critical event gets its job a fast pass over events at once; stacks
answering a request get it a full pass (stack aggregation is part of it).

Ingest reads its batches and hands over job ids (service/ingest/handoff.py); this module never sees a batch, so
diagnosis does not depend on the wire protocol."""

from __future__ import annotations

import logging

from redis import Redis
from redis.exceptions import RedisError

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
        "ib_verbs_error",
        "ib_async_event",
        "port_down",
        "nic_fatal",
        "nic_module_error",
        "edac",
        "nccl_error",
        "watchdog_timeout",
        "watchdog_stuck",
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


def is_critical(kind: str, severity: str | None) -> bool:
    """Whether an event of this kind and severity cannot wait for the next periodic pass."""
    return kind in CRITICAL_KINDS or severity == "critical"


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
