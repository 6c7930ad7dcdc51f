"""Thin Celery wrappers: periodic detection for every active job, diagnosis of one job on demand, and the
fast pass over a job's events that a critical event triggers."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from celery import chord, group
from celery.signals import worker_init

from service.config import get_settings
from service.db import session_scope
from service.diagnosis import detect, service
from service.diagnosis import split as split_pass
from service.worker import celery_app

log = logging.getLogger(__name__)


@worker_init.connect
def _warm_up(**_: object) -> None:
    # Before the pool forks (prefork) or runs (solo): every child starts with the classifier loaded.
    detect.warm_up()


@celery_app.task(name="diagnosis.detect_active_jobs")
def detect_active_jobs() -> int:
    """Beat: enqueue a diagnosis of every running job whose agents reported recently."""
    settings = get_settings()
    with session_scope() as session:
        jobs = service.active_jobs(session, now=datetime.now(UTC), active_s=settings.active_job_s)
    for job_id in jobs:
        # Expire unrun copies so a slow worker does not accumulate a backlog of identical passes; a copy that
        # finds a pass of its job running skips.
        diagnose_job.apply_async(args=[job_id], kwargs={"periodic": True}, expires=settings.diagnosis_interval_s * 2)
    return len(jobs)


@celery_app.task(name="diagnosis.diagnose_job")
def diagnose_job(
    job_id: str, periodic: bool = False, now: str | None = None, split: bool | None = None
) -> dict[str, object]:
    """Idempotent: a re-run stores nothing new and decides nothing twice. `now` (ISO 8601): the pass as of then,
    for a caller that keeps its own clock (the chaos campaign's accelerated time); it schedules no recheck.
    A job of diagnosis_split_min_gpus GPUs or more (or any job, `split` True; none, False) is split across
    workers: a chord of group tasks, then `merge_pass` (service/diagnosis/split.py)."""
    settings = get_settings()
    started = time.perf_counter()
    with session_scope() as session:
        planned = split_pass.plan(
            session, job_id=job_id, settings=settings, now=_as_of(now), skip_if_busy=periodic, split=split
        )
    if planned is None:
        with session_scope() as session:
            result = service.diagnose_job(
                session, job_id=job_id, settings=settings, skip_if_busy=periodic, now=_as_of(now)
            )
        return _report(result, recheck=now is None)
    if planned.skipped:
        return {"job_id": job_id, "new_findings": 0, "decisions": [], "skipped": True}
    # Sent after the plan's commit: the group tasks read the windows it built.
    header = group(peer_group.s(job_id, nodes, planned.ends) for nodes in planned.groups)
    merged = chord(header)(merge_pass.s(job_id, planned.now.isoformat(), now is None))
    plan_s = time.perf_counter() - started
    return {"job_id": job_id, "split": len(planned.groups), "merge_id": merged.id, "skipped": False, "plan_s": plan_s}


@celery_app.task(name="diagnosis.peer_group", ignore_result=False)
def peer_group(job_id: str, node_ids: list[int], ends: list[str]) -> dict[str, object]:
    """A split pass's group task: its nodes' part of each peer span (read-only; a re-run returns the same)."""
    with session_scope() as session:
        return split_pass.group_parts(session, job_id=job_id, node_ids=node_ids, ends=ends)


@celery_app.task(name="diagnosis.merge_pass", ignore_result=False)
def merge_pass(results: list[dict[str, Any]], job_id: str, now: str, recheck: bool = True) -> dict[str, object]:
    """A split pass's chord body: the job's pass with the groups' peer parts; then it is no longer in flight."""
    settings = get_settings()
    when = datetime.fromisoformat(now)
    with session_scope() as session:
        result = service.diagnose_job(
            session, job_id=job_id, settings=settings, now=when, peer_parts=split_pass.merged_parts(results)
        )
        split_pass.finish(session, job_id=job_id, now=when)
    groups_s = [float(r.get("seconds", 0.0)) for r in results]
    return {**_report(result, recheck=recheck), "timings": result.timings, "groups_s": groups_s}


@celery_app.task(name="diagnosis.diagnose_events")
def diagnose_events(job_id: str, now: str | None = None) -> dict[str, object]:
    """The critical-event fast pass; idempotent like the full one. `now` as for `diagnose_job`."""
    with session_scope() as session:
        result = service.diagnose_events(session, job_id=job_id, settings=get_settings(), now=_as_of(now))
    return _report(result, recheck=now is None)


def _as_of(now: str | None) -> datetime | None:
    return datetime.fromisoformat(now) if now is not None else None


def _report(result: service.DiagnosisResult, *, recheck: bool = True) -> dict[str, object]:
    if result.new_findings or result.decisions or result.stack_requests:
        log.info(
            "job %s: %d new findings, incidents %s, decisions %s, stack requests %s",
            result.job_id,
            result.new_findings,
            result.incidents,
            result.decisions,
            result.stack_requests,
        )
    if recheck and result.recheck_in_s is not None:
        # A stack-dump deadline: look again then, even if no agent writes anything in between.
        diagnose_job.apply_async(args=[result.job_id], countdown=max(result.recheck_in_s, 0.5))
    return {
        "job_id": result.job_id,
        "new_findings": result.new_findings,
        "decisions": result.decisions,
        "skipped": result.skipped,
    }
