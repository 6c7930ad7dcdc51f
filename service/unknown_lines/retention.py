"""The unknown-line counts' share of the retention pass: they go with the log events they summarize
(FAULTLINE_LOG_RETENTION_DAYS). The worker imports this module at start (service/worker.py), as it does the UI's
(service/ui/retention.py); maintenance imports no domain's rows."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from service.config import get_settings
from service.maintenance import partitions
from service.maintenance import service as maintenance
from service.unknown_lines import service


def _prune(session: Session, now: datetime) -> int:
    return service.prune(session, now=now, retention=partitions.log_retention(get_settings()))


maintenance.register_pruner("unknown_line_counts", _prune)
