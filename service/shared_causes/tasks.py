"""Thin Celery wrappers for shared-cause incidents."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.config import get_settings
from service.db import session_scope
from service.shared_causes import service as shared_causes
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.resolve_quiet_shared_incidents")
def resolve_quiet_shared_incidents() -> int:
    """Beat: shared incidents with no new evidence for a while resolve themselves. Idempotent."""
    settings = get_settings()
    with session_scope() as session:
        quiet = shared_causes.resolve_quiet(
            session, now=datetime.now(UTC), quiet_s=settings.shared_cause_quiet_resolve_s
        )
    if quiet:
        log.info("shared incidents resolved after a quiet period: %s", quiet)
    return len(quiet)
