"""Spans of time in query strings (`7d`, `24h`, `90m`, `3600s`), checked at the edge: a clear 422, never a 500."""

from __future__ import annotations

import re

from service.errors import InvalidInput

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
# A year: longer spans read more history than any page needs, and a typo of 7000d should say so.
MAX_SPAN_S = 366 * 86_400.0


def parse_span(text: str, *, field: str) -> float:
    """Seconds from `7d`, `24h`, `90m` or `3600s`; a 422 naming the field otherwise."""
    match = _SPAN.match(text.strip())
    seconds = float(match.group(1)) * _UNITS[match.group(2)] if match else None
    if seconds is None or not 0 < seconds <= MAX_SPAN_S:
        message = f"{text!r} is not a span of time between 1s and 366d: give a number and s, m, h or d, e.g. 7d or 24h"
        raise InvalidInput(f"{field}: {message}", details=[{"field": field, "message": message}])
    return seconds
