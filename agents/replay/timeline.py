"""A failed run's log files as the agent would have read them: events in the logs' own order, moved to now.

Each file goes through the agent's own parsers (the kernel log parser for a dmesg/kern.log/journal excerpt, the
training log parser for a job's output), so a replay shows what the agent makes of the lines, not a second
reading. Every line is fed with its own reading time from a synthetic clock; an event whose time equals its
reading time carried no stamp of its own and is placed just after the stamped event before it. Then all
events of all files keep their order and spacing, gaps over MAX_GAP_S are shortened to it (a log spanning days
would fall outside the service's windows), and the whole timeline is moved to end just before now.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agents.events import Event
from agents.gpu import GpuReading, parse_exporter
from agents.parsers import LineParser
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training import TrainingLogParser

KINDS = ("kernel", "training", "dcgm")
MAX_GAP_S = 30.0
END_BEFORE_NOW_S = 1.0
_TICK = timedelta(milliseconds=1)
# A kernel log or the system journal: NVRM/Xid/SXid/AER lines, dmesg's [seconds.micro] or -T stamps, syslog's
# "kernel:" field, journald's "Mon DD HH:MM:SS host unit[pid]: " (the fabric manager and other daemons log there).
_KERNEL_LINE = re.compile(
    r"NVRM: |\bSXid\b|\bnvidia-nvswitch|pcieport |\bAER: |\bkernel: |^\s*\[\s*\d+\.\d+\] |"
    r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] |\bmlx5_core\b|"
    r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@/-]+\[\d+\]: |(?i:fabric ?manager)"
)
_DCGM_LINE = re.compile(r"^DCGM_(?:FI|EXP)_\w+\{", re.MULTILINE)
_HEADER_END = "\n---\n"


class ReplayError(Exception):
    """A replay cannot be built from these files; the message says why."""


@dataclass(frozen=True, slots=True)
class LogFile:
    """One file of one node, and how to read it."""

    node: str
    path: Path
    kind: str  # one of KINDS


@dataclass(slots=True)
class NodeReplay:
    """What one node's files hold: parsed events (times moved) and, from a dcgm-exporter scrape, GPU readings."""

    node: str
    events: list[Event]
    readings: list[GpuReading]
    unparsed: int = 0  # parser failures (a bug, counted like the agent counts them)


def guess_kind(text: str) -> str:
    """`dcgm` for an exporter scrape, `kernel` when a tenth of the lines (or 3) look like a kernel log or the
    system journal, else `training` (a job's own output; `training:` in front of a file says so when it went through
    the journal)."""
    if _DCGM_LINE.search(text):
        return "dcgm"
    lines = [line for line in text.splitlines() if line.strip()]
    kernel = sum(1 for line in lines if _KERNEL_LINE.search(line))
    return "kernel" if lines and (kernel >= 3 or kernel * 10 >= len(lines)) else "training"


def log_text(path: Path) -> str:
    """A file's log text; a corpus file's `# key: value` header up to its `---` line is left out."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    if text.startswith("#"):
        head, sep, body = text.partition(_HEADER_END)
        if sep and all(line.startswith("#") or not line.strip() for line in head.splitlines()):
            return body
    return text


def _parse(parser: LineParser, text: str, clock: datetime) -> tuple[list[Event], set[datetime]]:
    """Events of `text`, each line read at its own tick; also the reading times (events at one carry no stamp)."""
    events: list[Event] = []
    reads: set[datetime] = set()
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    now = clock
    for line in lines:
        now += _TICK
        reads.add(now)
        events.extend(parser.feed(line, now=now))
    now += _TICK
    reads.add(now)
    events.extend(parser.flush(now=now))
    return events, reads


def _stamped(events: list[Event], reads: set[datetime]) -> list[Event]:
    """Events with a time each: an unstamped one goes just after the stamped one before it (or before the first
    stamped one after it); a file with no stamps at all keeps its reading ticks."""
    own = [e.ts not in reads for e in events]
    if not any(own):
        return events
    out: list[Event] = []
    first = next(e.ts for e, o in zip(events, own, strict=True) if o)
    last: datetime | None = None
    pending: list[Event] = []
    for event, has_own in zip(events, own, strict=True):
        if has_own:
            last = event.ts
            out.append(event)
        elif last is None:
            pending.append(event)
        else:
            last += _TICK
            out.append(replace(event, ts=last))
    lead = [replace(e, ts=first - _TICK * (len(pending) - i)) for i, e in enumerate(pending)]
    return lead + out


def read_node(files: Sequence[LogFile], *, clock: datetime) -> NodeReplay:
    """One node's files through the agent's parsers (times not yet moved)."""
    node = files[0].node
    events: list[Event] = []
    readings: list[GpuReading] = []
    unparsed = 0
    for item in files:
        text = log_text(item.path)
        if item.kind == "dcgm":
            readings += parse_exporter(text)
            continue
        # Mono dmesg stamps count from a boot: a fixed one keeps their spacing (the move to now comes later).
        parser: LineParser = (
            KernelLogParser(boot_time=clock - timedelta(days=1)) if item.kind == "kernel" else TrainingLogParser()
        )
        parsed, reads = _parse(parser, text, clock)
        unparsed += parser.parse_errors
        events += _stamped(parsed, reads)
    return NodeReplay(node, events, readings, unparsed)


def moved_to_now(nodes: Sequence[NodeReplay], *, now: datetime, max_gap_s: float = MAX_GAP_S) -> float:
    """Move every event of every node, in place, so that the timeline keeps its order, no gap exceeds
    `max_gap_s` and the last event is END_BEFORE_NOW_S before `now`. Returns the span in seconds afterwards."""
    everything = sorted(
        ((e.ts, n, i) for n, node in enumerate(nodes) for i, e in enumerate(node.events)), key=lambda t: t[0]
    )
    if not everything:
        return 0.0
    new_times: dict[tuple[int, int], datetime] = {}
    cursor = everything[0][0]
    previous = cursor
    max_gap = timedelta(seconds=max_gap_s)
    for ts, n, i in everything:
        cursor += min(ts - previous, max_gap)
        previous = ts
        new_times[(n, i)] = cursor
    shift = now.astimezone(UTC) - timedelta(seconds=END_BEFORE_NOW_S) - cursor
    for n, node in enumerate(nodes):
        node.events = sorted(
            (replace(e, ts=new_times[(n, i)] + shift) for i, e in enumerate(node.events)), key=lambda e: e.ts
        )
    return (cursor - everything[0][0]).total_seconds()
