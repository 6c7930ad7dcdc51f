"""Thin Celery wrapper for the NVLink domains' check (service/nvlink/service.py)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.config import get_settings
from service.db import session_scope
from service.nvlink import service
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="nvlink.check_domains")
def check_domains() -> list[int]:
    """Beat: every domain judged from its trays' fabric state and NVLink findings, a failing one's domain incident
    opened and decided (its trays cordoned), also when no job runs there to be diagnosed. Idempotent."""
    settings = get_settings()
    if not settings.nvlink_domains_enabled:
        return []
    with session_scope() as session:
        touched = [i.id for i in service.check(session, now=datetime.now(UTC), settings=settings)]
    if touched:
        log.info("NVLink domain incidents open: %s", touched)
    return touched
