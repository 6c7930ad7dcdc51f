"""Which kinds of signal a job has, and what its diagnosis cannot do without the ones it lacks.

A job on nodes that run only dcgm-exporter (no training log, no process the agent can see) is diagnosed from its
counters alone; the job page and its incidents say so, instead of the detectors that need ranks staying silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Exists, exists, func, select
from sqlalchemy.orm import Session

from service.models import Job, LogEvent, ProcessSnapshot, job_columns

# The signal is "had" when the job's agents reported it at all within this long of the job's last report.
LOOKBACK = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class SignalSource:
    name: str
    present: bool
    # What the diagnosis lacks without it (shown when absent).
    without: str


def job_signal_sources(session: Session, *, job: Job | str) -> list[SignalSource]:
    """GPU counters, machine metrics, training log and training processes: present or not, in one query (`job` a
    row, or its external id: then looked up inside the same query)."""
    if isinstance(job, Job):
        job_id: Any = job.id
        last_seen: Any = job.last_seen_at
    else:
        row = select(Job.id, Job.last_seen_at).where(Job.external_id == job).subquery()
        job_id, last_seen = select(row.c.id).scalar_subquery(), select(row.c.last_seen_at).scalar_subquery()
    since = func.coalesce(last_seen, func.now()) - LOOKBACK

    def columns(source: str) -> Exists:
        return exists().where(job_columns.c.job_id == job_id, job_columns.c.source == source)

    training = exists().where(LogEvent.job_id == job_id, LogEvent.ts >= since, LogEvent.source == "training")
    processes = exists().where(ProcessSnapshot.job_id == job_id, ProcessSnapshot.ts >= since)
    gpu, node, log, procs = session.execute(select(columns("gpu"), columns("node"), training, processes)).one()
    return [
        SignalSource(
            "GPU counters (dcgm-exporter or NVML)",
            bool(gpu),
            "no GPU counters: stragglers, counter climbs (PCIe, NVLink, remapped rows) and lost GPUs go unseen; "
            "give the agents --dcgm-url",
        ),
        SignalSource(
            "machine metrics (network ports, host)",
            bool(node),
            "no machine metrics: InfiniBand port flaps, congestion and host memory pressure go unseen",
        ),
        SignalSource(
            "training log",
            bool(log),
            "no step source: hang detection reads only GPU activity, and no CUDA, NCCL or traceback line names a "
            "rank; follow the training log with --log",
        ),
        SignalSource(
            "training processes",
            bool(procs),
            "no training processes: no stacks can be dumped, so a hang's culprit is named from GPU counters only; "
            "the job is known by its registered rank map or the exporter's labels",
        ),
    ]
