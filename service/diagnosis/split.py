"""A diagnosis pass of a big job split across Celery workers: one task per node group, then a merge.

The plan (in the task the beat sends) builds the windows that closed, as a single pass does first, and picks the
peer comparison's span ends. Each group task then reads its nodes' windows and returns, per span, the per-GPU
half of the peer summary (ml.peer_spans.span_part): the stage that reads and summarizes every GPU's windows.
The merge task, the chord's body, runs the job's pass with them: ml.peer_spans.judge_span makes the job-wide
comparisons (medians, robust spread, the activity gauge, whether a counter only grows) on all GPUs' figures at
once, so the findings are exactly a single pass's (tests/service/diagnosis/test_diagnosis_split.py holds the two to it).
The other stages run in the merge: they are SQL aggregates PostgreSQL computes, and the event detectors.

Nothing is shared between the tasks but PostgreSQL and the Celery result backend (the chord's results), so the
workers may run on any number of machines. A split pass in flight is recorded in `detector_states`: a periodic
pass that finds one younger than `diagnosis_split_timeout_s` skips, as it skips a single pass that runs.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ml.findings import JobInfo
from ml.peer_spans import MetricPart, SpanPart
from service.config import Settings
from service.diagnosis import metric_passes, state, windows
from service.diagnosis.service import _PASS_LOCK, _lock
from service.jobs import service as jobs
from service.models import Job, Node, Rank

# Spans a pass gives its group tasks, newest first: a steady pass has one or two. A cold start's 24 would move
# about 260 bytes a GPU each through Redis twice (400 MB at 65,536 GPUs, near Redis's 512 MB bulk limit): its
# older spans are summarized in the merge instead, from all the job's windows, as a single pass does.
GROUP_SPANS_MAX = 3
IN_FLIGHT = "split_pass"  # detector_states row: when the job's split pass in flight was planned
IN_FLIGHT_VERSION = 1


@dataclass(slots=True)
class Plan:
    """A split pass to dispatch: the pass's clock, the node groups, the peer spans' ends (ISO)."""

    job_id: str
    now: datetime
    groups: list[list[int]]
    ends: list[str]
    skipped: bool = False


def job_gpus(session: Session, *, job: Job) -> int:
    """The job's size: its world size, else its ranks."""
    if job.world_size:
        return int(job.world_size)
    return int(session.scalar(select(func.count()).select_from(Rank).where(Rank.job_id == job.id)) or 0)


def plan(
    session: Session,
    *,
    job_id: str,
    settings: Settings,
    now: datetime | None = None,
    skip_if_busy: bool = False,
    split: bool | None = None,
) -> Plan | None:
    """A split pass for a job of at least `diagnosis_split_min_gpus` GPUs (or as `split` says), its windows built;
    None: the job takes the single-task pass (small, unknown, or splitting turned off)."""
    now = now or datetime.now(UTC)
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    if job is None or split is False:
        return None
    gpus = job_gpus(session, job=job)
    if split is None and (not settings.diagnosis_split_min_gpus or gpus < settings.diagnosis_split_min_gpus):
        return None
    node_ids = jobs.node_ids(session, job=job)
    if not node_ids:
        return None
    if not _lock(session, _PASS_LOCK, job, wait=not skip_if_busy):
        return Plan(job_id, now, [], [], skipped=True)
    _, flight = state.load(session, job_id=job.id, detector=IN_FLIGHT, version=IN_FLIGHT_VERSION)
    started = flight.get("planned_at")
    wall = datetime.now(UTC)
    if (
        skip_if_busy
        and started
        and wall - datetime.fromisoformat(started) < timedelta(seconds=settings.diagnosis_split_timeout_s)
    ):
        return Plan(job_id, now, [], [], skipped=True)
    lookback = settings.diagnosis_window_s
    closed = windows.rollup(session, job=job, now=now, grace_s=settings.window_grace_s, lookback_s=lookback)
    windows.rollup_nodes(session, job=job, now=now, grace_s=settings.node_window_grace_s, lookback_s=lookback)
    judged = windows.peers_judged(closed, now=now, gpus=gpus, settings=settings)
    ends = [e.isoformat() for e in metric_passes.peer_ends(session, job=job, closed=judged)[:GROUP_SPANS_MAX]]
    per_group = max(1, round(settings.diagnosis_split_group_gpus * len(node_ids) / max(gpus, 1)))
    groups = [node_ids[i : i + per_group] for i in range(0, len(node_ids), per_group)]
    state.save(
        session,
        job_id=job.id,
        detector=IN_FLIGHT,
        version=IN_FLIGHT_VERSION,
        cursor=now,
        state={"planned_at": wall.isoformat(), "groups": len(groups)},
        now=now,
    )
    return Plan(job_id, now, groups, ends)


def group_parts(session: Session, *, job_id: str, node_ids: list[int], ends: list[str]) -> dict[str, Any]:
    """A group task's work: per span end, its nodes' part of the peer summary, encoded for the result backend."""
    started = time.perf_counter()
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    if job is None:
        return {"parts": {}}
    info = _group_info(session, job=job, node_ids=node_ids)
    parts: dict[str, SpanPart] = {end: SpanPart() for end in ends}
    # A group without any of the job's ranks would compare nodes a single pass leaves out (its frame keeps the
    # job's rank nodes only): it contributes nothing, as there.
    if info.rank_nodes or not _job_has_ranks(session, job=job):
        names = windows.node_names(session, node_ids=node_ids)
        when = [datetime.fromisoformat(e) for e in ends]
        parts.update(metric_passes.peer_parts(session, job=job, info=info, ends=when, names=names, node_ids=node_ids))
    encoded = {end: encode_part(part) for end, part in parts.items()}
    return {"parts": encoded, "seconds": time.perf_counter() - started}


def merged_parts(results: list[dict[str, Any]]) -> dict[str, list[SpanPart]]:
    """The group tasks' parts by span end; an end some group lacks is left out (the merge computes it whole)."""
    ends = set.intersection(*(set(r.get("parts", {})) for r in results)) if results else set()
    return {end: [decode_part(r["parts"][end]) for r in results] for end in sorted(ends)}


def finish(session: Session, *, job_id: str, now: datetime) -> None:
    """The split pass is no longer in flight (the merge ran)."""
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    if job is not None:
        state.save(session, job_id=job.id, detector=IN_FLIGHT, version=IN_FLIGHT_VERSION, cursor=now, state={}, now=now)


def _group_info(session: Session, *, job: Job, node_ids: list[int]) -> JobInfo:
    """The job as the group's part needs it: which of the group's nodes run its ranks (the rest of JobInfo, such
    as the pipeline stages, the merge reads whole)."""
    ranks = session.execute(
        select(Rank.rank, Node.name)
        .join(Node, Node.id == Rank.node_id)
        .where(Rank.job_id == job.id, Rank.node_id.in_(node_ids))
    ).all()
    return JobInfo(job_id=job.external_id, world_size=job.world_size, rank_nodes={r: n for r, n in ranks})


def _job_has_ranks(session: Session, *, job: Job) -> bool:
    return session.scalar(select(Rank.rank).where(Rank.job_id == job.id).limit(1)) is not None


# --- the result backend's JSON: arrays as base64 of their bytes (exact float64, a fifth of JSON numbers' size) ---


def _array(values: np.ndarray) -> dict[str, str]:
    data = np.ascontiguousarray(values)
    return {"dtype": data.dtype.str, "b64": base64.b64encode(data.tobytes()).decode("ascii")}


def _from_array(encoded: dict[str, str]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded["b64"]), dtype=np.dtype(encoded["dtype"])).copy()


def encode_part(part: SpanPart) -> dict[str, Any]:
    # Per metric its values only: the sample counts are the part's (a metric's mean counts them where it has a
    # value, its rate everywhere), sent once; half the bytes a part would take with them per metric.
    metrics = {
        name: {"mean": _array(m.mean), "rate": None if m.rate is None else _array(m.rate), "rises": list(m.rises)}
        for name, m in part.metrics.items()
    }
    return {
        "rows": part.rows,
        "notna": part.notna,
        "gauge": part.gauge,
        "window_starts": part.window_starts,
        "unit_gauge": _array(part.unit_gauge),
        "window_of": _array(part.window_of),
        "window_gauge": _array(part.window_gauge),
        "units": part.units,
        "counts": _array(part.counts),
        "metrics": metrics,
    }


def decode_part(data: dict[str, Any]) -> SpanPart:
    counts = _from_array(data["counts"])
    metrics = {}
    for name, m in data["metrics"].items():
        mean = _from_array(m["mean"])
        rate = None if m["rate"] is None else _from_array(m["rate"])
        metrics[name] = MetricPart(
            mean=mean,
            mean_counts=np.where(np.isfinite(mean), counts, 0.0),  # a mean is NaN exactly where nothing was summed
            rate=rate,
            rate_counts=None if rate is None else counts,
            rises=(int(m["rises"][0]), int(m["rises"][1]), int(m["rises"][2])),
        )
    return dataclasses.replace(
        SpanPart(),
        rows=int(data["rows"]),
        notna={k: int(v) for k, v in data["notna"].items()},
        gauge=data["gauge"],
        window_starts=[int(w) for w in data["window_starts"]],
        unit_gauge=_from_array(data["unit_gauge"]),
        window_of=_from_array(data["window_of"]),
        window_gauge=_from_array(data["window_gauge"]),
        units=list(data["units"]),
        counts=counts,
        metrics=metrics,
    )
