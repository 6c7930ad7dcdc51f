"""Thin Celery wrappers for incidents."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.config import get_settings
from service.db import session_scope
from service.incidents import service as incidents
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.resolve_quiet_incidents")
def resolve_quiet_incidents() -> int:
    """Beat: incidents without new evidence and with nothing waiting resolve themselves, and so do job-wide ones
    whose job trains again. Idempotent."""
    settings = get_settings()
    now = datetime.now(UTC)
    with session_scope() as session:
        recovered = incidents.resolve_recovered(session, now=now, after_s=settings.incident_recovered_after_s)
        quiet = incidents.resolve_quiet(session, now=now, quiet_s=settings.incident_quiet_resolve_s)
    if recovered:
        log.info("incidents resolved as their job trains again: %s", recovered)
    if quiet:
        log.info("incidents resolved after a quiet period: %s", quiet)
    return len(recovered) + len(quiet)
