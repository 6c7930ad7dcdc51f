"""The node agent's log parsers: kernel log (Xid, SXid, NVRM, PCIe AER) and training logs.

Each parser is fed one raw line at a time and returns finished events; multi-line blocks (a Python
traceback, the "fallen off the bus" message, a torchrun failure table) are held until they end, and
`flush()` emits whatever is still pending when the input goes idle.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

from agents.events import Event

_log = logging.getLogger(__name__)

# The wire protocol caps an event's line at 65,536 characters; stay under it with room to spare.
MAX_EVENT_LINE = 60_000
# Regexes only look at this much of a line: bounded work per line whatever a process prints.
MAX_MATCH_CHARS = 16_384


class LineParser:
    """Base of the parsers: `feed` and `flush` never raise, because a log line must never take the agent
    down. What fails is a bug: counted in `parse_errors` and logged at debug level."""

    name = "log"

    def __init__(self) -> None:
        self.parse_errors = 0

    def feed(self, line: str, *, now: datetime) -> list[Event]:
        try:
            return self._feed(line, as_utc(now))
        except Exception:
            self.parse_errors += 1
            _log.debug("%s parser failed on %r", self.name, line[:200], exc_info=True)
            return []

    def flush(self, *, now: datetime) -> list[Event]:
        """Emit what is still pending; events finished before a failure are kept."""
        events: list[Event] = []
        try:
            self._flush(events)
        except Exception:
            self.parse_errors += 1
            self._abandon_pending()
            _log.debug("%s parser failed to flush", self.name, exc_info=True)
        return events

    def _feed(self, line: str, now: datetime) -> list[Event]:
        raise NotImplementedError

    def _flush(self, out: list[Event]) -> None:
        raise NotImplementedError

    def _abandon_pending(self) -> None:
        """Drop pending state that failed to flush, so it cannot fail again."""


def parse_text(parser: LineParser, text: str, *, now: datetime) -> list[Event]:
    """Feed every line of `text` to `parser`, then flush: handy for tests and --dry-run."""
    events: list[Event] = []
    lines = text.split("\n")  # as the followers split: a lone \r is a progress bar redrawing, not a line end
    if lines and not lines[-1]:
        lines.pop()
    for line in lines:
        events.extend(parser.feed(line, now=now))
    events.extend(parser.flush(now=now))
    return events


def as_utc(ts: datetime) -> datetime:
    """Timezone-aware copy of `ts`; naive stamps are taken as UTC."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def clip(text: str, limit: int = MAX_EVENT_LINE) -> str:
    """Keep the head and the tail of an over-long text (the end of a block is often the cause)."""
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} chars cut] ...\n{text[-half:]}"


def match_window(line: str) -> str:
    """The part of a line the regexes see: the head (prefixes) and the tail (text appended last)."""
    if len(line) <= MAX_MATCH_CHARS:
        return line
    return line[:4096] + " ... " + line[-(MAX_MATCH_CHARS - 4096) :]


MONTHS: dict[str, int] = {
    m: i + 1 for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))
}


def infer_year(month: int, day: int, now: datetime) -> int:
    """Year for a stamp without one (syslog, glog): this year, unless that lands well in the future."""
    try:
        candidate = datetime(now.year, month, day, tzinfo=UTC)
    except ValueError:
        return now.year
    return now.year - 1 if (candidate - now).days > 2 else now.year


def frac_us(frac: str | None) -> int:
    """Microseconds from a stamp's fraction digits: "5" -> 500000, "123456789" -> 123456."""
    return int(frac.ljust(6, "0")[:6]) if frac else 0


def iso_datetime(m: re.Match[str]) -> datetime | None:
    """UTC time from an ISO 8601 match whose groups are year, month, day, hour, minute, second,
    fraction and zone ("Z", "+0100" or "-01:00"; none is UTC); None for an impossible date."""
    y, mo, d, h, mi, s, frac, tz = m.groups()
    try:
        ts = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), frac_us(frac), tzinfo=UTC)
    except ValueError:
        return None
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        ts -= sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4]))
    return ts


__all__ = ["MAX_EVENT_LINE", "LineParser", "as_utc", "clip", "parse_text"]
