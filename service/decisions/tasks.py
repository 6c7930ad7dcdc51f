"""Thin Celery wrappers for the decision lifecycle."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.db import session_scope
from service.decisions import lifecycle
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.expire_decisions")
def expire_decisions() -> int:
    """Beat: decisions nobody acknowledged in time expire. Idempotent."""
    with session_scope() as session:
        expired = lifecycle.expire_overdue(session, now=datetime.now(UTC))
    if expired:
        log.warning("decisions expired unacknowledged: %s", expired)
    return len(expired)
