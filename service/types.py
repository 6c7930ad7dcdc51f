"""Constrained types every domain's schemas share: names, ids, int4 bounds and plausible times.

They live at the package root, not in one domain, so a domain that needs a node name does not import ingest.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, Field, ValidationInfo

NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
JobId = Annotated[str, Field(min_length=1, max_length=200)]
# pids, ranks and sizes are int4 columns: a larger value must be refused, not wrapped around.
INT32_MAX = 2**31 - 1
# The times a node may report, around the server's clock: its spool replays batches this old, its clock is
# this far ahead at worst. A time outside is a broken clock or hostile input; stored, a year-10000 line
# would break every later query over its job. The ingest route passes the configured window as the
# validation context ("time_window": (max age, max ahead)); these are the defaults.
TIME_WINDOW = (timedelta(days=30), timedelta(days=1))


def time_window(context: dict[str, object] | None) -> tuple[timedelta, timedelta]:
    """(max age, max ahead) from a validation context, or the defaults."""
    return (context or {}).get("time_window", TIME_WINDOW)  # type: ignore[return-value]


def implausible(value: datetime, window: tuple[timedelta, timedelta]) -> str:
    max_age, max_ahead = window
    return (
        f"{value.isoformat()} is implausible: more than {max_age} before or {max_ahead} after the server's "
        "clock (check the node's clock)"
    )


def _plausible(value: datetime, info: ValidationInfo) -> datetime:
    window = time_window(info.context)
    now = datetime.now(UTC)
    if not now - window[0] <= value <= now + window[1]:
        raise ValueError(implausible(value, window))
    return value


PlausibleTime = Annotated[AwareDatetime, AfterValidator(_plausible)]
# A start that may lie far back (an alert firing for months), but never ahead of the clock or before 2000.
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def _started(value: datetime, info: ValidationInfo) -> datetime:
    _, max_ahead = (info.context or {}).get("time_window", TIME_WINDOW)
    if not _EPOCH <= value <= datetime.now(UTC) + max_ahead:
        raise ValueError(f"{value.isoformat()} is implausible: before 2000 or more than {max_ahead} ahead")
    return value


StartTime = Annotated[AwareDatetime, AfterValidator(_started)]
# A time people set (a silence's end, a token's expiry): anything up to ten years ahead. Beyond year 9999
# Python cannot even read a stored time back, which would break every page listing it.
HORIZON = timedelta(days=3653)


def _within_horizon(value: datetime) -> datetime:
    if not _EPOCH <= value <= datetime.now(UTC) + HORIZON:
        raise ValueError(f"{value.isoformat()} is out of range: give a time between 2000 and ten years from now")
    return value


HorizonTime = Annotated[AwareDatetime, AfterValidator(_within_horizon)]
