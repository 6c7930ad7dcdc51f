"""Turn pydantic validation errors into a 422 that names each offending field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from service.errors import InvalidInput


def error_details(errors: Sequence[Any]) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in err.get("loc", ())) or "body", "message": err.get("msg", "")}
        for err in errors
    ]


def invalid(errors: Sequence[Any]) -> InvalidInput:
    """A 422 whose message names the first offending field and whose details name them all."""
    details = error_details(errors) or [{"field": "body", "message": "invalid request"}]
    first = details[0]
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return InvalidInput(f"{first['field']}: {first['message']}{more}", details=details)


def invalid_from(exc: ValidationError, *, prefix: str = "body") -> InvalidInput:
    return invalid([{**e, "loc": (prefix, *e["loc"])} for e in exc.errors(include_url=False, include_input=False)])
