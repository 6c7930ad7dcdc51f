"""Thin Celery wrappers for maintenance work."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from service.config import get_settings
from service.db import session_scope
from service.maintenance import service
from service.ui import sessions
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.prune_old_signals")
def prune_old_signals() -> dict[str, int]:
    """Idempotent: deleting what is already gone deletes nothing."""
    settings = get_settings()
    with session_scope() as session:
        deleted = service.prune_old_signals(
            session,
            metric_retention=timedelta(hours=settings.metric_retention_hours),
            log_retention=timedelta(days=settings.log_retention_days),
        )
        deleted["ui_sessions"] = sessions.prune_expired(session, now=datetime.now(UTC))
    if any(deleted.values()):
        log.info("pruned old signals: %s", deleted)
    return deleted
