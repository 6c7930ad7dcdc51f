"""Retention of the one signal table that is not partitioned: agent_batches, pruned in bounded chunks; and of
the expired rows other domains register (the web UI's sessions).

The partitioned signal tables (service/maintenance/partitions.py) lose whole partitions instead.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.maintenance.partitions import delete_in_chunks

Pruner = Callable[[Session, datetime], int]
# Expired rows of other domains, pruned in the retention pass after agent_batches. Each domain registers its own
# (the web UI its sessions, in service/ui/retention.py, a module the worker imports at start), so maintenance
# imports none of them.
_pruners: dict[str, Pruner] = {}


def register_pruner(name: str, pruner: Pruner) -> None:
    """Run `pruner` in every retention pass; the rows it deleted appear under `name` in the pass's result."""
    _pruners[name] = pruner


def prune_registered(session: Session, *, now: datetime) -> dict[str, int]:
    """Run each registered pruner, in registration order; rows deleted by name."""
    return {name: prune(session, now) for name, prune in _pruners.items()}


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
