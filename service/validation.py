"""Turn pydantic validation errors into a 422 that names each offending field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from service.errors import InvalidInput

M = TypeVar("M", bound=BaseModel)


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


def validated(model: type[M], **fields: Any) -> M:
    """`model(**fields)`, or the 422 naming each offending field (a web form checked by the API's own schema)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise invalid(exc.errors()) from None
