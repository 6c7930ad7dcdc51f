"""Retention of the one signal table that is not partitioned: agent_batches, pruned in bounded chunks.

The partitioned signal tables (service/maintenance/partitions.py) lose whole partitions instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.maintenance.partitions import delete_in_chunks


def prune_agent_batches(
    session: Session, *, now: datetime, retention: timedelta, chunk: int = 50_000, max_chunks: int = 40
) -> int:
    """Delete batch records older than `retention`, up to `chunk` x `max_chunks` rows; return rows deleted.

    One row per node per batch: 2,048 nodes shipping every second add 1.2 M rows per 10-minute beat
    interval, so one run may delete up to 2 M, in statements of `chunk` rows each."""
    deleted = delete_in_chunks(
        session.connection(), "agent_batches", "received_at", cutoff=now - retention, chunk=chunk, max_chunks=max_chunks
    )
    session.flush()
    return deleted
