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
