"""Unknown lines: /api/v1/unknown-lines."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from service.deps import DbSession
from service.errors import ErrorBody
from service.params import Cursor
from service.security import Principal, require_scope
from service.unknown_lines import service
from service.unknown_lines.schemas import UnknownLinePage

router = APIRouter(prefix="/api/v1/unknown-lines", tags=["unknown lines"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Since = Annotated[
    str,
    Query(
        max_length=40,
        description="How far back: a span (`24h`, `90m`, `7d`, at most 366d) or an ISO 8601 time with its zone",
    ),
]
Source = Annotated[
    str | None, Query(pattern=r"^[a-z][a-z0-9_.-]{0,31}$", description="Exactly this source: `training`, `kmsg`, ...")
]

Node = Annotated[str | None, Query(max_length=253, description="A part of the name of a node that logged it")]
Job = Annotated[str | None, Query(max_length=200, description="A part of the id of a job it was logged in")]


@router.get(
    "",
    response_model=UnknownLinePage,
    responses={422: {"model": ErrorBody, "description": "A bad `since`, `source` or cursor"}},
)
def list_unknown_lines(
    session: DbSession,
    _: Reader,
    since: Since = "24h",
    source: Source = None,
    node: Node = None,
    job: Job = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> UnknownLinePage:
    """Log lines that look like errors but match no known form (events of kind `unmatched_error`, from any source),
    counted per form: the line with its variable parts masked. The most lines first. With `node` or `job`, only
    those nodes' or jobs' lines are counted; name filters match a part of the name, case-insensitively."""
    return service.list_forms(
        session,
        since=service.since_from(since, now=datetime.now(UTC)),
        source=source,
        node=node or None,
        job=job or None,
        limit=limit,
        cursor=cursor,
    )
