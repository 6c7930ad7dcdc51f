"""One error hierarchy; each class knows its HTTP status, so routes never build responses by hand."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, OperationalError
from starlette.responses import JSONResponse

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """Every error response."""

    error: str = Field(examples=["invalid"], description="A stable code: invalid, unauthenticated, forbidden, ...")
    message: str = Field(examples=["body.metrics.0.gpu: Input should be greater than or equal to 0"])
    details: list[dict[str, str]] | None = Field(
        default=None, description="For invalid input: one entry per offending field, with its path."
    )


class FaultlineError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return body


class Unauthenticated(FaultlineError):
    status_code = 401
    code = "unauthenticated"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(FaultlineError):
    status_code = 403
    code = "forbidden"


class NotFound(FaultlineError):
    status_code = 404
    code = "not_found"


class Conflict(FaultlineError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(FaultlineError):
    status_code = 413
    code = "payload_too_large"


class InvalidInput(FaultlineError):
    status_code = 422
    code = "invalid"


class ServiceUnavailable(FaultlineError):
    """A dependency (database, broker) is down: clients should retry later."""

    status_code = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


def error_response(exc: Exception) -> JSONResponse | None:
    """The response for an error the service knows how to answer; None for a bug (a 500)."""
    if isinstance(exc, OperationalError | psycopg.OperationalError):
        log.warning("database unavailable: %s", exc)
        exc = ServiceUnavailable("database unavailable; retry later")
    elif isinstance(exc, DataError | psycopg.DataError):
        # A value that passed validation but that PostgreSQL cannot store (a NUL in text, a number out of
        # its type's range): the client's input, and the request's transaction is rolled back.
        cause = exc.orig if isinstance(exc, DataError) else exc
        exc = InvalidInput(f"a value cannot be stored: {str(cause).splitlines()[0]}")
    if isinstance(exc, FaultlineError):
        return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=exc.headers)
    return None
