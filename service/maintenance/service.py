"""Retention: old signals are deleted in bounded chunks so the hot tables stay small."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

# table -> timestamp column; metric samples have their own (shorter) retention
_LOG_TABLES = {"log_events": "ts", "stack_dumps": "ts", "process_snapshots": "ts", "agent_batches": "received_at"}


def prune_old_signals(
    session: Session, *, metric_retention: timedelta, log_retention: timedelta, chunk: int = 50_000
) -> dict[str, int]:
    """Delete one chunk per table of signals older than their retention; return rows deleted."""
    now = datetime.now(UTC)
    cutoffs = {"metric_samples": ("ts", now - metric_retention)}
    cutoffs.update({table: (column, now - log_retention) for table, column in _LOG_TABLES.items()})
    deleted: dict[str, int] = {}
    for table, (column, cutoff) in cutoffs.items():
        # ctid chunks: metric_samples has no primary key, and a bounded delete keeps locks short.
        result = session.execute(
            text(
                f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
                f"SELECT ctid FROM {table} WHERE {column} < :cutoff LIMIT :chunk))"
            ),
            {"cutoff": cutoff, "chunk": chunk},
        )
        deleted[table] = result.rowcount
    session.flush()
    return deleted
