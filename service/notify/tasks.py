"""Thin Celery wrappers: send what the outbox has due."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from service.config import get_settings
from service.db import get_engine, make_sessionmaker
from service.notify import outbound, sender
from service.worker import celery_app


@celery_app.task(name="notify.send_due")
def send_due() -> dict[str, Any]:
    """Idempotent: claims commit before each POST, so a re-run or a concurrent run never posts a row twice."""
    settings = get_settings()
    with outbound.client(settings) as client:
        report = sender.send_due(
            make_sessionmaker(get_engine()), now=datetime.now(UTC), settings=settings, http_client=client
        )
    return asdict(report)
