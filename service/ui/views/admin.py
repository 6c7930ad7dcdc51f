"""What the pages with forms share: the viewer as the services' caller, form values parsed, errors made readable."""

from __future__ import annotations

from datetime import UTC, datetime

from service.errors import FaultlineError, InvalidInput
from service.security import Principal
from service.ui.sessions import Viewer

# Units a duration field may be given in; the number goes in a field of its own.
DURATION_UNITS = {"minutes": 60, "hours": 3600, "days": 86_400}


def principal(viewer: Viewer) -> Principal:
    """The signed-in person as the domain services expect a caller; its actor reads `scope:name`, like the viewer's."""
    return Principal(token_id=0, scope=viewer.scope, node_name=None, name=viewer.name, expires_at=None)


def _refuse(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", details=[{"field": field, "message": message}])


def duration_s(amount: str, unit: str, *, field: str = "duration") -> float | None:
    """Seconds from a number and a unit; None when the number is left blank."""
    amount = amount.strip()
    if not amount:
        return None
    if unit not in DURATION_UNITS:
        raise _refuse(field, f"unit {unit!r} is not one of {', '.join(DURATION_UNITS)}")
    try:
        value = float(amount)
    except ValueError:
        raise _refuse(field, f"{amount!r} is not a number") from None
    return value * DURATION_UNITS[unit]


def utc_time(value: str, *, field: str) -> datetime | None:
    """A date and time typed in a form (a datetime-local field has no zone: it is read as UTC); None when blank."""
    value = value.strip()
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _refuse(field, f"{value!r} is not a date and time like 2026-11-23T06:00") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def error_lines(exc: FaultlineError) -> list[str]:
    """One readable line per offending field (pydantic's 'Value error, ' and the 'body.' path prefix dropped)."""
    details = exc.details if isinstance(exc.details, list) else []
    lines = []
    for detail in details:
        if not isinstance(detail, dict):
            continue
        field = str(detail.get("field", ""))
        field = "" if field == "body" else field.removeprefix("body.")
        message = str(detail.get("message", "")).removeprefix("Value error, ")
        lines.append(f"{field}: {message}" if field else message)
    return lines or [exc.message]
