"""Thin Celery wrappers: periodic detection for every active job, diagnosis of one job on demand, and the
fast pass over a job's events that a critical event triggers."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.config import get_settings
from service.db import session_scope
from service.diagnosis import service
from service.worker import celery_app

log = logging.getLogger(__name__)


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
def diagnose_job(job_id: str, periodic: bool = False) -> dict[str, object]:
    """Idempotent: a re-run stores nothing new and decides nothing twice."""
    settings = get_settings()
    with session_scope() as session:
        result = service.diagnose_job(session, job_id=job_id, settings=settings, skip_if_busy=periodic)
    return _report(result)


@celery_app.task(name="diagnosis.diagnose_events")
def diagnose_events(job_id: str) -> dict[str, object]:
    """The critical-event fast pass; idempotent like the full one."""
    with session_scope() as session:
        result = service.diagnose_events(session, job_id=job_id, settings=get_settings())
    return _report(result)


def _report(result: service.DiagnosisResult) -> dict[str, object]:
    if result.new_findings or result.decisions or result.stack_requests:
        log.info(
            "job %s: %d new findings, incidents %s, decisions %s, stack requests %s",
            result.job_id,
            result.new_findings,
            result.incidents,
            result.decisions,
            result.stack_requests,
        )
    if result.recheck_in_s is not None:
        # A stack-dump deadline: look again then, even if no agent writes anything in between.
        diagnose_job.apply_async(args=[result.job_id], countdown=max(result.recheck_in_s, 0.5))
    return {
        "job_id": result.job_id,
        "new_findings": result.new_findings,
        "decisions": result.decisions,
        "skipped": result.skipped,
    }
