"""A job and its nodes' parsed events in the database, as ingest stores them: for tests of a diagnosis pass."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session

from agents.events import Event
from service.ingest.schemas import IngestBatch
from service.ingest.service import UpsertCache, store_batches
from service.jobs import service as jobs
from service.jobs.schemas import JobIn


def register(session: Session, nodes: list[str], *, prefix: str, ranks_per_node: int = 8) -> str:
    """A new job over `nodes`, `ranks_per_node` ranks each in order; returns its id."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    ranks = [
        {"rank": r, "node": n, "local_rank": r % ranks_per_node}
        for r, n in enumerate(n for n in nodes for _ in range(ranks_per_node))
    ]
    jobs.register(session, job_in=JobIn(job_id=name, world_size=len(ranks), ranks=ranks))
    return name


def store(session: Session, node: str, job: str, at: datetime, events: Iterable[Event]) -> None:
    """The agent's events of one node, stamped `at`, stored as one batch of the job."""
    logs = [
        {"ts": at, "source": e.source, "kind": e.kind, "line": e.line, "severity": e.severity, "rank": e.rank,
         "fields": e.fields}
        for e in events
    ]  # fmt: skip
    batch = {"batch_id": str(uuid.uuid4()), "node": node, "sent_at": at, "job_id": job, "logs": logs}
    store_batches(session, batches=[IngestBatch.model_validate(batch)], cache=UpsertCache())
    session.flush()
