"""What the agent's parsers produce: one event per log line (or multi-line block) worth shipping."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SEVERITIES = ("debug", "info", "warning", "error", "critical")


@dataclass(slots=True)
class Event:
    """A parsed log event, shaped like the wire protocol's `LogEventIn`."""

    ts: datetime  # timezone-aware; the line's own time when it carries one, else when it was read
    source: str  # "kmsg" or "training"
    kind: str  # e.g. "xid", "nccl_warn", "watchdog_timeout", "traceback", "step"
    line: str  # the raw text; several lines joined by "\n" for multi-line events
    severity: str = "info"
    fields: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    path: str | None = None
    job_id: str | None = None
    # Critical events (fatal Xid, crash, traceback) make the agent ship at once instead of at the interval.
    critical: bool = False

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ts": self.ts.isoformat(),
            "source": self.source,
            "kind": self.kind,
            "line": self.line,
            "severity": self.severity,
        }
        if self.fields:
            out["fields"] = self.fields
        if self.rank is not None:
            out["rank"] = self.rank
        if self.path is not None:
            out["path"] = self.path
        if self.job_id is not None:
            out["job_id"] = self.job_id
        return out
