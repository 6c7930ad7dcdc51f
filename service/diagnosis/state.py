"""Detectors' running state between a job's passes, in PostgreSQL so any worker continues where another left.

Each detector keeps a cursor (what it has processed up to) and a JSON state under a version number: state
written by another version of the detector is ignored, so a code change never reads stale state as valid.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.models import DetectorState


def load(session: Session, *, job_id: int, detector: str, version: int) -> tuple[datetime | None, dict[str, Any]]:
    """(cursor, state) of a detector for a job; (None, {}) when there is none of this version."""
    row = session.execute(
        select(DetectorState.cursor, DetectorState.state, DetectorState.version).where(
            DetectorState.job_id == job_id, DetectorState.detector == detector
        )
    ).first()
    if row is None or row.version != version:
        return None, {}
    return row.cursor, row.state or {}


def save(
    session: Session,
    *,
    job_id: int,
    detector: str,
    version: int,
    cursor: datetime | None,
    state: dict[str, Any],
    now: datetime,
) -> None:
    values = {"version": version, "cursor": cursor, "state": state, "updated_at": now}
    session.execute(
        insert(DetectorState)
        .values(job_id=job_id, detector=detector, **values)
        .on_conflict_do_update(index_elements=["job_id", "detector"], set_=values)
    )
