"""argparse value types shared by the service's commands: a clear message instead of a traceback."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number


def positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_s(value: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value.lower())
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (e.g. 7d, 12h, 30m, 90s)")
    return float(match[1]) * _UNITS[match[2] or "s"]


def utc_time(value: str) -> datetime:
    """ISO 8601; a time without a zone is UTC."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
