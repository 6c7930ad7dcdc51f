"""Thin Celery wrapper for the planned maintenance windows' pass."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.config import get_settings
from service.db import session_scope
from service.planned import service
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.planned_windows")
def planned_windows() -> dict[str, list[int]]:
    """Beat: drain ahead of the windows due, return the nodes of those over. Idempotent."""
    with session_scope() as session:
        done = service.tick(session, settings=get_settings(), now=datetime.now(UTC))
    if done.prepared or done.returned:
        log.info("maintenance windows prepared %s, returned %s", done.prepared, done.returned)
    return {"prepared": done.prepared, "returned": done.returned}
