"""The incident's timeline: the signals its findings cite, the findings, decisions and incident events, merged."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ml.findings import signal_refs
from service.incidents.schemas import FindingOut, IncidentOut
from service.ui import plots
from service.ui.views.incident.logs import LogLine

# A cited stack dump: id, when, node, rank, and the error py-spy reported if it failed.
Dump = tuple[int, datetime, str | None, int | None, str | None]


@dataclass
class Entry:
    """One line of the timeline."""

    at: datetime
    kind: str  # signal, finding, decision, incident
    title: str
    detail: str = ""
    nodes: list[str] = field(default_factory=list)
    count: int = 1
    finding_id: int | None = None
    tone: str = ""  # ok, bad: how a decision ended


def _clip(text: str, limit: int = 200) -> str:
    """One line that says what happened: a traceback's last line (the exception), otherwise the first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if "Traceback (most recent call last)" in lines[0] else lines[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _signal_entries(
    findings: list[FindingOut],
    logs: list[LogLine],
    dumps: list[Dump],
) -> list[Entry]:
    out = [
        Entry(
            at=log.ts,
            kind="signal",
            title=f"{log.source} {log.kind}",
            detail=_clip(log.line),
            nodes=[log.node] if log.node else [],
        )
        for log in logs
    ]
    for _, ts, node, rank, error in dumps:
        what = f"stack dump of rank {rank}" if rank is not None else "stack dump"
        out.append(Entry(at=ts, kind="signal", title=what, detail=error or "", nodes=[node] if node else []))
    seen: set[str] = set()
    for f in findings:
        for s in signal_refs(f.evidence):
            if s["type"] not in ("metric", "node_metric", "process"):
                continue
            key = json.dumps(s, sort_keys=True, default=str)
            at = plots.parse_time(s.get("ts")) or plots.parse_time(s.get("from"))
            if key in seen or at is None:
                continue
            seen.add(key)
            node = s.get("node")
            until = plots.parse_time(s.get("to"))
            span = f" until {until:%H:%M:%S}" if until else ""
            if s["type"] == "metric":
                gpu = f" GPU {s['gpu']}" if s.get("gpu") is not None else ""
                title, detail = f"metric {s.get('metric', '?')}", f"{node or ''}{gpu}{span}".strip()
            elif s["type"] == "node_metric":
                title, detail = f"metric {s.get('metric', '?')}", f"{node or ''} {s.get('subject', '')}{span}".strip()
            else:
                title, detail = f"process of rank {s.get('rank', '?')}", f"{node or ''}{span}".strip()
            out.append(Entry(at=at, kind="signal", title=title, detail=detail, nodes=[node] if node else []))
    return out


def _merge(entries: list[Entry]) -> list[Entry]:
    """Signals of one kind within a second of the first (15 ranks' watchdog timeouts, interleaved with their
    exceptions) become one line; so do findings that repeat the one before them (a detector firing every pass)."""
    out: list[Entry] = []
    open_groups: dict[str, Entry] = {}
    for e in entries:
        last = out[-1] if out else None
        if e.kind == "finding" and last and last.kind == "finding" and (last.title, last.nodes) == (e.title, e.nodes):
            last.count += 1
            continue
        group = open_groups.get(e.title) if e.kind == "signal" else None
        if group is not None and e.at - group.at <= timedelta(seconds=1):
            group.count += 1
            group.nodes += [n for n in e.nodes if n not in group.nodes]
            continue
        if e.kind == "signal":
            open_groups[e.title] = e
        out.append(e)
    return out


def capped(entries: list[Entry], limit: int) -> tuple[list[Entry], int]:
    """At most `limit` lines, dropping the latest signals first: findings and decisions always stay."""
    room = limit - sum(e.kind != "signal" for e in entries)
    kept, seen = [], 0
    for e in entries:
        if e.kind == "signal":
            seen += 1
            if seen > room:
                continue
        kept.append(e)
    return kept, len(entries) - len(kept)


_ORDER = {"incident": 0, "signal": 1, "finding": 2, "decision": 3}


def merged_timeline(
    incident: IncidentOut,
    *,
    logs: list[LogLine],
    dumps: list[Dump],
    findings: list[FindingOut],
) -> list[Entry]:
    """Signals, findings, decisions and the incident's opening, acknowledgements and resolution, in order, bursts
    merged."""
    entries = _signal_entries(findings, logs, dumps)
    for f in findings:
        entries.append(
            Entry(
                at=f.observed_at,
                kind="finding",
                title=f"{f.detector} · {f.category} ({f.role})",
                detail=f.summary,
                nodes=[f.node] if f.node else [],
                finding_id=f.id,
            )
        )
    for d in incident.decisions:
        what = f"decision #{d.id}: {d.kind}{f' {d.node}' if d.node else ''}"
        note = d.state.replace("_", " ")
        if d.state == "pending" and d.actor:
            note = f"{'created' if d.evidence.get('manual') else 'approved'} by {d.actor}, waiting for a scheduler"
        entries.append(Entry(at=d.created_at, kind="decision", title=f"{what} proposed", detail=f"{note} · {d.reason}"))
        if d.acked_at is not None:
            outcome = d.outcome or d.state
            entries.append(
                Entry(
                    at=d.acked_at,
                    kind="decision",
                    title=f"{what} {outcome}{f' by {d.actor}' if d.actor else ''}",
                    detail=d.outcome_message or "",
                    tone="ok" if outcome == "done" else "bad",
                )
            )
    entries.append(Entry(at=incident.opened_at, kind="incident", title=f"incident #{incident.id} opened"))
    for ack in incident.acknowledgements:
        entries.append(Entry(at=ack.at, kind="incident", title=f"acknowledged by {ack.actor}", detail=ack.note or ""))
    if incident.resolved_at is not None:
        entries.append(
            Entry(at=incident.resolved_at, kind="incident", title="resolved", detail=incident.resolution or "")
        )
    entries.sort(key=lambda e: (e.at, _ORDER[e.kind]))
    return _merge(entries)
