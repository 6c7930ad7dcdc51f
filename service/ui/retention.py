"""The web UI's share of the retention pass: its expired sessions go with the worker's other old rows.

The worker imports this module at start (service/worker.py); maintenance never imports the UI.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from service.maintenance import service as maintenance
from service.ui import sessions


def _prune_sessions(session: Session, now: datetime) -> int:
    return sessions.prune_expired(session, now=now)


maintenance.register_pruner("ui_sessions", _prune_sessions)
