"""Thin Celery wrapper for the jobs' progress marks (service/jobs/progress.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from service.db import session_scope
from service.jobs import progress
from service.worker import celery_app


@celery_app.task(name="maintenance.track_job_progress")
def track_job_progress() -> int:
    """Beat: fold every running job's new step lines into its progress mark. Idempotent (a maximum, and the earliest
    time it was logged): a pass run twice, or two at once, leave the same mark."""
    with session_scope() as session:
        return progress.track(session, now=datetime.now(UTC))
