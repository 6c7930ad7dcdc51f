"""One incident as the on-call engineer reads it: what broke, on which machine, why we think so, what was done.

A fixed number of queries whatever the incident holds, all through the domains' service functions: the
incident with its findings and decisions (incidents.get), then one query each for the log lines
(nodes.log_events_by_id) and stack dumps (directives.dumps_by_id) its evidence points at, the job's nodes
(incidents.node_states), and the silence that muted it (silences.get); plus one per port or host metric a
machine-level finding cites (nodes.subject_against_peers: the machine against its peers).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from ml.demarcation import localizing
from ml.findings import evidence_of, signal_refs
from service.decisions.schemas import DecisionOut
from service.directives import service as directives
from service.errors import NotFound
from service.incidents import service as incidents
from service.incidents.schemas import FindingOut, IncidentOut
from service.jobs.signal_sources import SignalSource, job_signal_sources
from service.nodes import history
from service.nodes import service as nodes
from service.silences import service as silences
from service.ui.formatting import GpuNames
from service.ui.views.incident.evidence import Chart, NodeWindows, charts, distinct_charts, node_charts, numbers
from service.ui.views.incident.finding_groups import FindingGroup, FindingRow, group_findings
from service.ui.views.incident.logs import LogGroup, cited_lines, log_groups
from service.ui.views.incident.stacks import StackView, stack_views
from service.ui.views.incident.timeline import Dump, Entry, capped, merged_timeline

LOG_LIMIT = 300  # log lines fetched for one page; the evidence of a big incident points at more
STACK_LIMIT = 200
TIMELINE_LIMIT = 400
_OPEN = ("awaiting_approval", "pending")


@dataclass
class SuspectView:
    node: str
    state: str | None  # the node's state now (suspect, cordoned, evicted...)
    confidence: float
    action: str
    reason: str
    findings: list[FindingOut]


@dataclass
class SilenceView:
    id: int
    node_pattern: str | None
    job_pattern: str | None
    ends_at: datetime
    author: str
    comment: str


@dataclass
class IncidentPage:
    incident: IncidentOut
    suspects: list[SuspectView]
    findings: list[FindingRow]
    finding_groups: list[FindingGroup]
    charts: list[Chart]
    stacks: list[StackView]
    timeline: list[Entry]
    timeline_omitted: int
    logs: list[LogGroup]
    log_count: int
    logs_omitted: int
    override_nodes: list[str]
    silence: SilenceView | None
    decisions: list[DecisionOut]  # the ones waiting on someone first, then newest first
    waiting: int  # how many wait for a person or a scheduler
    gpus: GpuNames  # names the incident's GPUs by index
    sources: list[SignalSource]  # which kinds of signal the job has (a job on dcgm-exporter alone lacks some)
    repeats: list[history.Repeat] = field(default_factory=list)  # the same root cause on its nodes lately

    @property
    def localizing(self) -> bool:
        """An open stall whose evidence does not yet separate a machine: the page says so instead of a list."""
        return self.incident.state != "resolved" and localizing(self.incident.root_cause, self.suspects)


def incident_page(session: Session, *, incident_id: int, repeat_window_s: float = 86400.0) -> IncidentPage:
    """Everything the incident page shows; raises NotFound for an unknown id. `repeat_window_s`: how far back an
    earlier incident of the same root cause on one of its nodes makes this one a repeat failure."""
    incident = incidents.get(session, incident_id=incident_id)
    findings = incident.findings
    signals = _signals(findings)
    log_ids = [i for i in signals.get("log", {}) if isinstance(i, int)]
    logs = cited_lines(session, ids=log_ids[:LOG_LIMIT], refs=signals.get("log", {}))
    stack_ids = [i for i in signals.get("stack", {}) if isinstance(i, int)][:STACK_LIMIT]
    dumps: list[Dump] = [tuple(row) for row in directives.dumps_by_id(session, ids=stack_ids)]  # type: ignore[misc]
    suspect_names = [s.node for s in incident.suspects]
    states = incidents.node_states(session, incident_id=incident.id, suspects=suspect_names)
    by_id = {f.id: f for f in findings}
    accused = {i for s in incident.suspects for i in s.finding_ids}
    gpus = GpuNames(nodes.gpu_inventory(session, nodes=sorted({f.node for f in findings if f.node})))
    rows = [
        FindingRow(
            finding=f,
            numbers=numbers(evidence_of(f.detector, f.evidence) or {}),
            accuses=f.id in accused,
            subject=gpus.subject(f.node, f.subject),
            summary=gpus.html(f.node, f.summary),
        )
        for f in sorted(findings, key=lambda f: (f.role != "cause", -f.confidence, f.observed_at))
    ]
    timeline, omitted = capped(merged_timeline(incident, logs=logs, dumps=dumps, findings=findings), TIMELINE_LIMIT)
    for entry in timeline:
        if entry.detail:  # findings' summaries and decisions' reasons quote kernel lines' GPU addresses
            entry.detail = gpus.html(entry.nodes[0] if entry.nodes else None, entry.detail)
    return IncidentPage(
        incident=incident,
        suspects=[
            SuspectView(
                node=s.node,
                state=states.get(s.node),
                confidence=s.confidence,
                action=s.action,
                reason=s.reason,
                findings=[by_id[i] for i in s.finding_ids if i in by_id],
            )
            for s in incident.suspects
        ],
        findings=rows,
        finding_groups=group_findings(rows),
        # One plot per signal: a fault that fires every pass cites the same metric again and again.
        charts=distinct_charts(
            chart for f in findings for chart in (*charts(f), *node_charts(f, _node_windows(session, incident, f)))
        ),
        stacks=stack_views(findings),
        timeline=timeline,
        timeline_omitted=omitted,
        logs=log_groups(logs),
        log_count=len(logs),
        logs_omitted=max(0, len(log_ids) - LOG_LIMIT),
        override_nodes=_suspects_first(suspect_names, states),
        silence=_silence(session, silence_id=incident.silence_id) if incident.silence_id else None,
        decisions=sorted(incident.decisions, key=lambda d: (d.state not in _OPEN, -d.id)),
        waiting=sum(d.state in _OPEN for d in incident.decisions),
        gpus=gpus,
        sources=job_signal_sources(session, job=incident.job_id),
        repeats=history.repeats_of(
            session,
            incident_id=incident.id,
            root_cause=incident.root_cause,
            opened_at=incident.opened_at,
            anchor=incident.anchor,
            suspects=suspect_names,
            window_s=repeat_window_s,
        ),
    )


# --- what the evidence cites, the override list, the silence ---


def _signals(findings: Iterable[FindingOut]) -> dict[str, dict[Any, list[int]]]:
    """The signals the findings' evidence points at, by type and id (or, for metric and process signals that
    have no id, by their description), with the findings that cite each; causes first, so a cap keeps them."""
    out: dict[str, dict[Any, list[int]]] = {}
    for f in sorted(findings, key=lambda f: (f.role != "cause", -f.confidence)):
        for signal in signal_refs(f.evidence):
            key: int | str | None = signal.get("id")
            if key is None:
                key = json.dumps(signal, sort_keys=True, default=str)
            cited = out.setdefault(signal["type"], {}).setdefault(key, [])
            if f.id not in cited:
                cited.append(f.id)
    return out


# How much of a machine-level metric's history the incident page plots around the finding.
NODE_PLOT_BEFORE = timedelta(minutes=5)
NODE_PLOT_AFTER = timedelta(minutes=1)


def _node_windows(session: Session, incident: IncidentOut, finding: FindingOut) -> NodeWindows:
    def read(node: str, subject: str, metric: str) -> list[dict[str, Any]]:
        return nodes.subject_against_peers(
            session,
            job_id=incident.job_id,
            node=node,
            subject=subject,
            column=metric,
            start=finding.observed_at - NODE_PLOT_BEFORE,
            end=finding.observed_at + NODE_PLOT_AFTER,
        )

    return read


def _suspects_first(suspects: list[str], job_nodes: Iterable[str]) -> list[str]:
    """Nodes an operator may name instead: the incident's suspects first, then the job's other nodes."""
    return suspects + sorted(n for n in job_nodes if n not in suspects)


def override_choices(session: Session, *, incident_id: int) -> list[str]:
    """The override list of an incident's decision card, read on its own (after an htmx action)."""
    suspects = incidents.suspect_names(session, incident_id=incident_id)
    return _suspects_first(suspects, incidents.node_states(session, incident_id=incident_id, suspects=suspects))


def _silence(session: Session, *, silence_id: int) -> SilenceView | None:
    try:
        s = silences.get(session, silence_id=silence_id)
    except NotFound:
        # Deleted since the incident was read (the key is SET NULL on delete): the page shows no silence.
        return None
    return SilenceView(s.id, s.node_pattern, s.job_pattern, s.expired_at or s.ends_at, s.author, s.comment)
