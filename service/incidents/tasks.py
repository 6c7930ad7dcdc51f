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
    """Beat: incidents without new evidence and with nothing waiting resolve themselves. Idempotent."""
    settings = get_settings()
    with session_scope() as session:
        resolved = incidents.resolve_quiet(session, now=datetime.now(UTC), quiet_s=settings.incident_quiet_resolve_s)
    if resolved:
        log.info("incidents resolved after a quiet period: %s", resolved)
    return len(resolved)
