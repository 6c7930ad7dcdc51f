"""One error hierarchy; each class knows its HTTP status, so routes never build responses by hand."""

from __future__ import annotations

from typing import Any


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
