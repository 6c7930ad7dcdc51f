"""Thin Celery wrapper for the idle spares' scheduled checks."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service.checks import spares
from service.config import get_settings
from service.db import session_scope
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.check_idle_spares")
def check_idle_spares() -> int:
    """Beat: run_checks level 1 to the idle spares due for one, within the budget. Idempotent within a period (a
    spare sent its checks has a pending directive, and is not sent another)."""
    with session_scope() as session:
        sent = spares.check_idle_spares(session, now=datetime.now(UTC), settings=get_settings())
    if sent:
        log.info("idle spares sent their checks: %s", ", ".join(sent))
    return len(sent)
