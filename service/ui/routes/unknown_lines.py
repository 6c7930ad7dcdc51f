"""Unknown lines: error-looking log lines no rule knows, one row per form, the most lines first."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from service.deps import DbSession
from service.errors import InvalidInput
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.unknown_lines import service as unknown_lines

router = APIRouter(include_in_schema=False)

# The windows the form offers; a hand-edited URL may give any span or time the API takes.
SINCE_CHOICES = ("1h", "6h", "24h", "7d", "30d")
_SOURCE = re.compile(r"^[a-z][a-z0-9_.-]{0,31}$")


@router.get("/unknown-lines")
def unknown_lines_page(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    since: Annotated[str, Query(max_length=40)] = "24h",
    source: Annotated[str, Query(max_length=32)] = "",
    node: Annotated[str, Query(max_length=253)] = "",
    job: Annotated[str, Query(max_length=200)] = "",
    cursor: str = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    since, source, node, job = since.strip() or "24h", source.strip(), node.strip(), job.strip()
    # A typo in a hand-edited URL says so rather than showing an empty list that looks like calm.
    if source and not _SOURCE.match(source):
        raise InvalidInput(f"source: {source!r} is not a source name (lower-case letters, digits, . _ -)")
    start = unknown_lines.since_from(since, now=datetime.now(UTC), field="since")
    filters = {"since": since if since != "24h" else "", "source": source, "node": node, "job": job, "cursor": cursor}
    params: dict[str, str | int] = {k: v for k, v in filters.items() if v}
    if limit != 50:
        params["limit"] = limit
    result = unknown_lines.list_forms(
        session,
        since=start,
        source=source or None,
        node=node or None,
        job=job or None,
        limit=limit,
        cursor=cursor or None,
    )
    return page(
        request,
        "unknown_lines.html",
        {"page": result, "params": params, "since": since, "start": start, "since_choices": SINCE_CHOICES},
    )
