"""Create directives and read what the agents sent back for them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from service.directives.schemas import DirectiveOut, StackDumpOut, StackDumpsOut
from service.errors import NotFound
from service.jobs.service import get_by_external_id
from service.models import Directive, Job, Node, StackDump
from service.schemas import Joined


def request_stack_dump(
    session: Session,
    *,
    job: Job,
    requested_by: str,
    reason: str | None,
    ttl_s: int,
    purpose: str | None = None,
    round: int | None = None,
    campaign_id: uuid.UUID | None = None,
    params: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Directive:
    """Ask every agent of the job to dump stacks; agents receive it with their next ingest answer. `params`: what
    the service keeps with its own request (not sent to agents).

    `now`: the diagnosis pass's time, which its rounds and deadlines are reckoned from (a caller that keeps its
    own clock, e.g. an accelerated replay, may be hours ahead of the database's); the wall clock by default."""
    now = now or datetime.now(UTC)
    directive = Directive(
        purpose=purpose,
        round=round,
        campaign_id=campaign_id,
        params=params,
        job_id=job.id,
        kind="dump_stacks",
        reason=reason,
        requested_by=requested_by,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )
    session.add(directive)
    session.flush()
    return directive


def active_by_job(session: Session) -> dict[str, list[dict[str, Any]]]:
    """Unexpired directives as ingest answers carry them, keyed by the job's external id."""
    rows = session.execute(
        select(Directive.id, Directive.kind, Job.external_id, Directive.reason, Directive.params)
        .join(Job, Job.id == Directive.job_id)
        .where(Directive.expires_at > datetime.now(UTC))
        .order_by(Directive.created_at)
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for directive_id, kind, job_id, reason, params in rows:
        item = {"id": str(directive_id), "kind": kind, "job_id": job_id}
        if kind == "checkpoint":  # the training side needs to know why and by when (service/planned/)
            item |= {"reason": reason, "deadline": (params or {}).get("deadline")}
        out.setdefault(job_id, []).append(item)
    return out


def to_out(directive: Directive, *, job_id: str) -> DirectiveOut:
    """The request as the API shows it, under the job's external id (the row holds the database's key)."""
    return DirectiveOut.model_validate(Joined(directive, job_id=job_id))


def _main_frames(threads: list[dict[str, Any]] | None) -> tuple[int, list[str]]:
    if not threads:
        return 0, []
    thread = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    frames = [
        f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"
        for f in thread.get("frames", [])
    ]
    return len(threads), frames


def stack_dumps(session: Session, *, job_id: str, directive_id: uuid.UUID) -> StackDumpsOut:
    """A stack-dump request and the dumps the agents sent for it, by rank."""
    job = get_by_external_id(session, job_id=job_id)
    directive = session.get(Directive, directive_id)
    if directive is None or directive.job_id != job.id:
        raise NotFound(f"no stack-dump request {directive_id} for job {job_id!r}")
    rows = session.execute(
        select(Node.name, StackDump.rank, StackDump.pid, StackDump.ts, StackDump.error, StackDump.threads)
        .join(Node, Node.id == StackDump.node_id)
        .where(StackDump.directive_id == str(directive_id))
        .order_by(StackDump.rank, StackDump.pid)
    ).all()
    dumps = []
    for node, rank, pid, ts, error, threads in rows:
        count, frames = _main_frames(threads)
        dumps.append(StackDumpOut(node=node, rank=rank, pid=pid, ts=ts, error=error, threads=count, frames=frames))
    return StackDumpsOut(
        directive=to_out(directive, job_id=job_id), nodes_reporting=len({d.node for d in dumps}), dumps=dumps
    )


def dumps_by_id(
    session: Session, *, ids: Sequence[int]
) -> Sequence[Row[int, datetime, str | None, int | None, str | None]]:
    """When and where each of these stack dumps was taken (id, ts, node, rank, py-spy's error), not the stacks."""
    if not ids:
        return []
    return session.execute(
        select(StackDump.id, StackDump.ts, Node.name, StackDump.rank, StackDump.error)
        .outerjoin(Node, Node.id == StackDump.node_id)
        .where(StackDump.id.in_(ids))
    ).all()
