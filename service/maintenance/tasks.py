"""Thin Celery wrappers for maintenance work."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from service.config import get_settings
from service.db import session_scope
from service.maintenance import compaction, partitions, service
from service.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="maintenance.ensure_partitions")
def ensure_partitions() -> dict[str, list[str]]:
    """Idempotent: partitions that exist are left alone."""
    now = datetime.now(UTC)
    created: dict[str, list[str]] = {}
    for spec in partitions.TABLES:
        # One table a transaction: the locks an attach takes end with it.
        with session_scope() as session:
            created.update(partitions.ensure_partitions(session, now=now, tables=(spec,)))
    if created:
        log.info("created partitions: %s", created)
    return created


@celery_app.task(name="maintenance.prune_old_signals")
def prune_old_signals() -> dict[str, Any]:
    """Idempotent: dropping what is already gone drops nothing."""
    settings = get_settings()
    now = datetime.now(UTC)
    retention = {spec.name: spec.retention(settings) for spec in partitions.TABLES}
    pruned: dict[str, Any] = {}
    for spec in partitions.TABLES:
        # One table a transaction: a DETACH holds the table's exclusive lock until the commit.
        with session_scope() as session:
            dropped = partitions.drop_expired_partitions(session, now=now, retention=retention, tables=(spec,))
        for table, what in dropped.items():
            if what.partitions or what.default_rows:
                pruned[table] = {"partitions": what.partitions, "default_rows": what.default_rows}
    with session_scope() as session:
        pruned["agent_batches"] = service.prune_agent_batches(
            session, now=now, retention=partitions.log_retention(settings)
        )
        pruned.update(service.prune_registered(session, now=now))
    if any(pruned.values()):
        log.info("pruned old signals: %s", pruned)
    return pruned


@celery_app.task(name="maintenance.compact_samples")
def compact_samples() -> dict[str, Any]:
    """Idempotent: a compacted hour's partition is gone, so a rerun finds nothing to do."""
    with session_scope() as session:
        done = compaction.compact_samples(session, now=datetime.now(UTC))
    if done.partitions or done.default_rows:
        log.info(
            "compacted %s: %d samples into %d chunks (%d late samples) in %.1f s",
            done.partitions,
            done.rows,
            done.chunks,
            done.default_rows,
            done.seconds,
        )
    return {"partitions": done.partitions, "rows": done.rows, "chunks": done.chunks, "late": done.default_rows}
