"""Reading the unknown-line counts: forms over a window, filtered and paged by count; and their retention."""

from __future__ import annotations

import base64
import binascii
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, Subquery, and_, delete, distinct, exists, func, or_, select
from sqlalchemy.orm import Session

from service.errors import InvalidInput
from service.fleet.spans import MAX_SPAN_S, parse_span
from service.maintenance.partitions import delete_in_chunks
from service.models import Job, Node, UnknownLineCount, UnknownLineForm
from service.params import BIGINT_MAX
from service.unknown_lines.record import hour_of
from service.unknown_lines.schemas import UnknownLineOut, UnknownLinePage

TOP_NODES = 5
MAX_JOBS = 20
_FORM_ID = re.compile(r"^[0-9a-f]{16}$")
_C = UnknownLineCount


def _encode(count: int, form_id: str) -> str:
    return base64.urlsafe_b64encode(f"u:{count}:{form_id}".encode()).decode().rstrip("=")


def _decode(cursor: str) -> tuple[int, str]:
    """The (count, form id) a page ended at. Pages follow the count, highest first, as the API lists them."""
    try:
        prefix, count, form_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().split(":")
        if prefix != "u" or not _FORM_ID.match(form_id) or not 0 <= int(count) <= BIGINT_MAX:
            raise ValueError(cursor)
        return int(count), form_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInput(f"invalid cursor {cursor!r}: pass back a `next_cursor` from an earlier page") from None


def _window(
    since: datetime, *, source: str | None = None, node: str | None = None, job: str | None = None
) -> Select[tuple[UnknownLineCount]]:
    """The count rows of the window and filters. By hour first, the key's index; then to the line."""
    query = select(_C).where(_C.hour >= hour_of(since), _C.last_seen_at >= since)
    if source:
        query = query.where(_C.source == source)
    if node:
        query = query.where(_C.node_id.in_(select(Node.id).where(Node.name.icontains(node, autoescape=True))))
    if job:
        query = query.where(_C.job_id.in_(select(Job.id).where(Job.external_id.icontains(job, autoescape=True))))
    return query


def list_forms(
    session: Session,
    *,
    since: datetime,
    source: str | None = None,
    node: str | None = None,
    job: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> UnknownLinePage:
    """Forms with lines since `since`, the most lines first (then by form id); name filters match a part."""
    rows = _window(since, source=source, node=node, job=job).subquery()
    lines = func.sum(rows.c.lines)
    grouped = select(
        rows.c.form_id,
        lines.label("lines"),
        func.count(distinct(rows.c.node_id)).label("nodes"),
        func.min(rows.c.first_seen_at).label("first_seen_at"),
        func.max(rows.c.last_seen_at).label("last_seen_at"),
        func.array_agg(distinct(rows.c.source)).label("sources"),
        func.array_agg(distinct(rows.c.job_id)).filter(rows.c.job_id.is_not(None)).label("job_ids"),
    ).group_by(rows.c.form_id)
    if cursor:
        count, form_id = _decode(cursor)
        grouped = grouped.having(or_(lines < count, and_(lines == count, rows.c.form_id > form_id)))
    page = grouped.order_by(lines.desc(), rows.c.form_id).limit(limit + 1).subquery()
    found = session.execute(
        select(page, UnknownLineForm.form, UnknownLineForm.example)
        .outerjoin(UnknownLineForm, UnknownLineForm.form_id == page.c.form_id)
        .order_by(page.c.lines.desc(), page.c.form_id)
    ).all()
    more = len(found) > limit
    found = found[:limit]
    ids = [r.form_id for r in found]
    top = _top_nodes(session, rows, ids) if ids else {}
    job_ids = {r.form_id: sorted(r.job_ids or [], reverse=True) for r in found}
    names = _job_names(session, {j for js in job_ids.values() for j in js[:MAX_JOBS]})
    items = [
        UnknownLineOut(
            form_id=r.form_id,
            # A form pruned while a flush re-counted it reads as its id until the next line restores it.
            form=r.form or r.form_id,
            example=r.example or "",
            sources=sorted(r.sources),
            count=int(r.lines),
            nodes=r.nodes,
            top_nodes=top.get(r.form_id, []),
            jobs=[names[j] for j in job_ids[r.form_id][:MAX_JOBS] if j in names],
            job_count=len(job_ids[r.form_id]),
            first_seen_at=r.first_seen_at,
            last_seen_at=r.last_seen_at,
        )
        for r in found
    ]
    last = found[-1] if more else None
    return UnknownLinePage(items=items, next_cursor=_encode(int(last.lines), last.form_id) if last else None)


def _top_nodes(session: Session, rows: Subquery, form_ids: list[str]) -> dict[str, list[str]]:
    """Each form's nodes with the most lines (up to TOP_NODES), in one statement for the whole page."""
    per_node = (
        select(rows.c.form_id, rows.c.node_id, func.sum(rows.c.lines).label("lines"))
        .where(rows.c.form_id.in_(form_ids))
        .group_by(rows.c.form_id, rows.c.node_id)
        .subquery()
    )
    rank = func.row_number().over(
        partition_by=per_node.c.form_id, order_by=(per_node.c.lines.desc(), per_node.c.node_id)
    )
    ranked = select(per_node, rank.label("rank")).subquery()
    top: dict[str, list[str]] = defaultdict(list)
    for form_id, name in session.execute(
        select(ranked.c.form_id, Node.name)
        .join(Node, Node.id == ranked.c.node_id)
        .where(ranked.c.rank <= TOP_NODES)
        .order_by(ranked.c.form_id, ranked.c.rank)
    ):
        top[form_id].append(name)
    return top


def _job_names(session: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    return {i: name for i, name in session.execute(select(Job.id, Job.external_id).where(Job.id.in_(sorted(ids))))}


@dataclass(frozen=True)
class Summary:
    forms: int
    lines: int


def summary(session: Session, *, since: datetime) -> Summary:
    """Distinct forms and lines since `since`: the overview's count."""
    rows = _window(since).subquery()
    forms, lines = session.execute(select(func.count(distinct(rows.c.form_id)), func.sum(rows.c.lines))).one()
    return Summary(forms=forms or 0, lines=int(lines or 0))


def forms_by_source(session: Session, *, since: datetime) -> dict[str, int]:
    """Distinct forms with lines since `since`, per source: /metrics' gauge."""
    rows = _window(since).subquery()
    found = session.execute(select(rows.c.source, func.count(distinct(rows.c.form_id))).group_by(rows.c.source))
    return {source: forms for source, forms in found}


def prune(session: Session, *, now: datetime, retention: timedelta, chunk: int = 50_000, max_chunks: int = 40) -> int:
    """Forget the counts of hours past `retention` (the log events' own: FAULTLINE_LOG_RETENTION_DAYS), then the
    forms no count names any more; return the count rows deleted."""
    cutoff = now - retention
    deleted = delete_in_chunks(
        session.connection(), "unknown_line_counts", "hour", cutoff=hour_of(cutoff), chunk=chunk, max_chunks=max_chunks
    )
    session.execute(
        delete(UnknownLineForm).where(
            UnknownLineForm.created_at < cutoff,
            ~exists().where(_C.form_id == UnknownLineForm.form_id),
        )
    )
    session.flush()
    return deleted


def since_from(text: str, *, now: datetime, field: str = "query.since") -> datetime:
    """The start of a window from a span back from now (`24h`, `90m`, `7d`) or an ISO 8601 time with its zone; a
    422 naming the field otherwise (a typo must not read as a calm, empty list)."""
    try:
        return now - timedelta(seconds=parse_span(text, field=field))
    except InvalidInput:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None or not now - timedelta(seconds=MAX_SPAN_S) <= when <= now:
        message = (
            f"{text!r} is neither a span back from now (`24h`, `90m`, `7d`, at most 366d) nor a past ISO 8601 time "
            "with its time zone (`2026-11-22T09:00:00Z`)"
        )
        raise InvalidInput(f"{field}: {message}", details=[{"field": field, "message": message}])
    return when
