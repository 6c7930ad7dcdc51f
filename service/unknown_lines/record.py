"""Counting unknown lines at ingest: the events of kind `unmatched_error` (error-looking lines no parser rule knows,
from any source) and the NVIDIA driver's warnings and errors of no known form (an `nvrm` event without a `failure`
form: a new driver's message, say) of one flush are grouped by form, source, node, job and hour in memory, then
written with two set-based statements, so a flood of one message costs the flush a few rows, not a row per line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg

from ml.line_forms import Forms, clip
from service.observability import UNKNOWN_LINES

KIND = "unmatched_error"
# Sources are the agents' own words (a pattern, no vocabulary): past this many in one process, the metric's label
# reads `other`, so a misbehaving agent cannot grow /metrics without bound. The tables keep the real source.
MAX_SOURCE_LABELS = 32

_labelled: dict[str, Any] = {}


class Event(Protocol):
    """What counting reads of an ingested log event (service/ingest/schemas.py LogEventIn)."""

    kind: str
    source: str
    severity: str | None
    fields: dict[str, Any] | None


# The driver's lines the kernel parser knows by form carry it as `failure` (agents/parsers/kernel.py); the rest that
# look bad are its unknown lines.
_NVRM_UNKNOWN_SEVERITIES = frozenset({"warning", "error", "critical"})


def is_unknown(event: Event) -> bool:
    """Whether the event is a line no rule knows that looks like trouble."""
    if event.kind == KIND:
        return True
    return (
        event.kind == "nvrm"
        and event.severity in _NVRM_UNKNOWN_SEVERITIES
        and not (event.fields or {}).get("failure")
        and "fallen off the bus" not in str((event.fields or {}).get("message") or "")
    )


@dataclass(frozen=True)
class Seen:
    """One unknown line with what the flush resolved about it."""

    source: str
    line: str
    ts: datetime
    node_id: int
    job_id: int | None
    host: str  # the node's name: the line's mentions of it read <host>


def observe(events: Iterable[Event]) -> None:
    """Count a stored batch's unknown lines on /metrics (`faultline_unknown_log_lines_total{source}`)."""
    for source, n in Counter(e.source for e in events if is_unknown(e)).items():
        child = _labelled.get(source)
        if child is None:
            if len(_labelled) < MAX_SOURCE_LABELS:
                child = _labelled[source] = UNKNOWN_LINES.labels(source)
            else:
                child = UNKNOWN_LINES.labels("other")
        child.inc(n)


def hour_of(ts: datetime) -> datetime:
    """The UTC hour a time falls in: the counts' grain. In Python: date_trunc on a timestamptz follows the session's
    time zone, which is not UTC everywhere."""
    return ts.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def record(conn: psycopg.Connection[Any], lines: Iterable[Seen]) -> int:
    """Add the lines to their forms' counts; return how many were counted."""
    forms = Forms()
    examples: dict[str, tuple[str, str, str]] = {}
    counts: dict[tuple[datetime, str, str, int, int], list[Any]] = {}
    total = 0
    for seen in lines:
        form = forms.of(seen.line, host=seen.host)
        examples.setdefault(form.form_id, (form.form, clip(seen.line), seen.source))
        key = (hour_of(seen.ts), form.form_id, seen.source, seen.node_id, seen.job_id or 0)
        row = counts.get(key)
        if row is None:
            counts[key] = [1, seen.ts, seen.ts]
        else:
            row[0] += 1
            row[1] = min(row[1], seen.ts)
            row[2] = max(row[2], seen.ts)
        total += 1
    if not total:
        return 0
    # Sorted keys, in one order for every flush: two API processes adding to the same rows cannot deadlock.
    ids = sorted(examples)
    keys = sorted(counts)
    with conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO unknown_line_forms (form_id, form, example, source)
            SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[])
            ON CONFLICT (form_id) DO NOTHING
            """,
            (ids, *([examples[i][k] for i in ids] for k in range(3))),
        )
        cur.execute(
            """
            INSERT INTO unknown_line_counts
                (hour, form_id, source, node_id, job_id, lines, first_seen_at, last_seen_at)
            SELECT h, f, s, n, NULLIF(j, 0), c, a, b
            FROM unnest(%s::timestamptz[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::bigint[],
                        %s::timestamptz[], %s::timestamptz[]) AS t(h, f, s, n, j, c, a, b)
            ON CONFLICT (hour, form_id, source, node_id, (COALESCE(job_id, 0))) DO UPDATE SET
                lines = unknown_line_counts.lines + excluded.lines,
                first_seen_at = LEAST(unknown_line_counts.first_seen_at, excluded.first_seen_at),
                last_seen_at = GREATEST(unknown_line_counts.last_seen_at, excluded.last_seen_at)
            """,
            (*([k[i] for k in keys] for i in range(5)), *([counts[k][i] for k in keys] for i in range(3))),
        )
    return total
