"""Request parameters every route shares, range-checked at the edge so PostgreSQL never sees an id it
cannot hold (a bigint) and a client gets a 422 naming the parameter instead of a 500."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query

BIGINT_MAX = 2**63 - 1

# An id in the URL path: ids start at 1 and fit PostgreSQL's bigint.
Id = Annotated[int, Path(ge=1, le=BIGINT_MAX, description="An id, as the list endpoints return it.")]


def id_query(description: str) -> Any:
    """An optional id in the query string, range-checked like a path id."""
    return Query(ge=1, le=BIGINT_MAX, description=description)


# A page cursor, as `next_cursor` gave it (base64url): the schema says its alphabet; only the API can say
# whether it is one it issued.
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="`next_cursor` of the previous page",
    ),
]
