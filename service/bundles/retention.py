"""The bundles' share of the retention pass: bundles older than `bundle_retention_days` are deleted.

The worker imports this module at start (service/worker.py); maintenance imports no domain."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.bundles import service
from service.config import get_settings
from service.maintenance import service as maintenance


def _prune_bundles(session: Session, now: datetime) -> int:
    return service.prune(session, now=now, retention=timedelta(days=get_settings().bundle_retention_days))


maintenance.register_pruner("evidence_bundles", _prune_bundles)
