"""One incident as the on-call engineer reads it: what broke, on which machine, why we think so, what was done.

A fixed number of queries whatever the incident holds: the incident with its findings and decisions
(incidents.service.get), then one query each for the log lines and stack dumps its evidence points at,
the job's nodes, and the silence that muted it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.decisions.schemas import DecisionOut
from service.incidents import service as incidents
from service.incidents.schemas import FindingOut, IncidentOut
from service.models import Incident, LogEvent, Node, Rank, StackDump
from service.models.silences import Silence
from service.ui import plots

LOG_LIMIT = 300  # log lines fetched for one page; the evidence of a big incident points at more
STACK_LIMIT = 200
TIMELINE_LIMIT = 400
_OPEN = ("awaiting_approval", "pending")
TREE_DEPTH = 48  # deeper stack trees are cut (the detector keeps 40 frames)
# Evidence fields that are plumbing, not something an engineer weighs.
_NOT_NUMBERS = {"signature", "stack_request", "job_id", "unit", "dominant", "covering_group", "tree"}


@dataclass
class SuspectView:
    node: str
    state: str | None  # the node's state now (suspect, cordoned, evicted...)
    confidence: float
    action: str
    reason: str
    findings: list[FindingOut]


@dataclass
class FindingRow:
    finding: FindingOut
    numbers: list[tuple[str, str]]  # the evidence's scalar fields, for counters and anything not plotted
    accuses: bool  # listed by a suspect


@dataclass
class Chart:
    finding: FindingOut
    subject: str  # whose line is red: "node-3 GPU 1", "rank 5", "the job"
    metric: str
    direction: str | None
    plot: plots.Plot
    reference: str  # what the dashed line is: the peers' median, the job's usual pace


@dataclass
class TreeNode:
    name: str
    count: int
    children: list[TreeNode]
    outlier: bool = False  # on the culprit's path
    shared: bool = False  # ... where every rank still is (the culprit has not parted from the rest yet)
    open: bool = False
    cut: bool = False  # deeper frames not shown


@dataclass
class StackGroupRow:
    signature: str
    state: str
    op: str
    ranks: str
    count: int
    node_count: int
    nodes: list[str]
    frames: list[str]
    outlier: bool


@dataclass
class StackView:
    findings: list[FindingOut]  # one analysis names one finding per machine: shown once
    method: str
    why: str
    dominant: str | None
    dominant_state: str | None
    culprit_ranks: str
    culprit_state: str | None
    covering_group: str | None
    unreported: str
    ranks_reporting: int | None
    signals_omitted: int
    groups: list[StackGroupRow]
    tree: TreeNode | None


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


@dataclass
class LogLine:
    id: int
    ts: datetime
    node: str | None
    source: str
    kind: str
    severity: str | None
    rank: int | None
    line: str
    finding_ids: list[int]


@dataclass
class LogGroup:
    """Lines of one source and kind (26 ranks' watchdog timeouts): read the first few, open the rest."""

    source: str
    kind: str
    lines: list[LogLine]
    nodes: list[str]
    ranks: list[int]
    finding_ids: list[int]

    @property
    def first(self) -> datetime:
        return self.lines[0].ts


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


def incident_page(session: Session, *, incident_id: int) -> IncidentPage:
    """Everything the incident page shows; raises NotFound for an unknown id."""
    incident = incidents.get(session, incident_id=incident_id)
    findings = incident.findings
    signals = _signals(findings)
    log_ids = [i for i in signals.get("log", {}) if isinstance(i, int)]
    logs = _logs(session, ids=log_ids[:LOG_LIMIT], refs=signals.get("log", {}))
    stack_ids = [i for i in signals.get("stack", {}) if isinstance(i, int)][:STACK_LIMIT]
    dumps = _stack_dumps(session, ids=stack_ids) if stack_ids else []
    suspect_names = [s.node for s in incident.suspects]
    states = _job_nodes(session, incident_id=incident.id, suspects=suspect_names)
    by_id = {f.id: f for f in findings}
    accused = {i for s in incident.suspects for i in s.finding_ids}
    timeline, omitted = _capped(_timeline(incident, logs=logs, dumps=dumps, findings=findings), TIMELINE_LIMIT)
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
        findings=[
            FindingRow(finding=f, numbers=numbers(f.evidence), accuses=f.id in accused)
            for f in sorted(findings, key=lambda f: (f.role != "cause", -f.confidence, f.observed_at))
        ],
        charts=[chart for f in findings for chart in charts(f)],
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
    )


# --- queries ---


def _signals(findings: Iterable[FindingOut]) -> dict[str, dict[Any, list[int]]]:
    """The signals the findings' evidence points at, by type and id (or, for metric and process signals that
    have no id, by their description), with the findings that cite each; causes first, so a cap keeps them."""
    out: dict[str, dict[Any, list[int]]] = {}
    for f in sorted(findings, key=lambda f: (f.role != "cause", -f.confidence)):
        for signal in f.evidence.get("signals") or []:
            if not isinstance(signal, Mapping) or not isinstance(signal.get("type"), str):
                continue
            key = signal.get("id")
            if key is None:
                key = json.dumps(signal, sort_keys=True, default=str)
            elif not isinstance(key, int) or isinstance(key, bool):
                continue
            cited = out.setdefault(signal["type"], {}).setdefault(key, [])
            if f.id not in cited:
                cited.append(f.id)
    return out


def _logs(session: Session, *, ids: list[int], refs: Mapping[Any, list[int]]) -> list[LogLine]:
    if not ids:
        return []
    rows = session.execute(
        select(
            LogEvent.id,
            LogEvent.ts,
            Node.name,
            LogEvent.source,
            LogEvent.kind,
            LogEvent.severity,
            LogEvent.rank,
            LogEvent.line,
        )
        .outerjoin(Node, Node.id == LogEvent.node_id)
        .where(LogEvent.id.in_(ids))
        .order_by(LogEvent.ts, LogEvent.id)
    ).all()
    return [
        LogLine(id=i, ts=ts, node=n, source=src, kind=k, severity=sev, rank=r, line=line, finding_ids=refs.get(i, []))
        for i, ts, n, src, k, sev, r, line in rows
    ]


def log_groups(lines: Iterable[LogLine]) -> list[LogGroup]:
    """Lines grouped by source and kind, groups in the order their first line came (the cause usually first)."""
    groups: dict[tuple[str, str], LogGroup] = {}
    for line in lines:
        g = groups.setdefault((line.source, line.kind), LogGroup(line.source, line.kind, [], [], [], []))
        g.lines.append(line)
        if line.node and line.node not in g.nodes:
            g.nodes.append(line.node)
        if line.rank is not None and line.rank not in g.ranks:
            g.ranks.append(line.rank)
        g.finding_ids += [i for i in line.finding_ids if i not in g.finding_ids]
    for g in groups.values():
        g.ranks.sort()
    return sorted(groups.values(), key=lambda g: g.first)


def _stack_dumps(session: Session, *, ids: list[int]) -> list[tuple[int, datetime, str | None, int | None, str | None]]:
    """When and where each cited stack dump was taken (not the stacks: the finding already summarizes them)."""
    return [
        tuple(row)  # type: ignore[misc]
        for row in session.execute(
            select(StackDump.id, StackDump.ts, Node.name, StackDump.rank, StackDump.error)
            .outerjoin(Node, Node.id == StackDump.node_id)
            .where(StackDump.id.in_(ids))
        ).all()
    ]


def _job_nodes(session: Session, *, incident_id: int, suspects: list[str]) -> dict[str, str]:
    """State of each node of the incident's job and of its suspects, in one query (as jobs.service.node_ids
    finds a job's nodes: its ranks, and nodes whose agents say they run it)."""
    job_id = select(Incident.job_id).where(Incident.id == incident_id).scalar_subquery()
    of_job = (
        select(Rank.node_id).where(Rank.job_id == job_id).union(select(Node.id).where(Node.current_job_id == job_id))
    )
    condition = Node.id.in_(of_job)
    if suspects:
        condition = or_(condition, Node.name.in_(suspects))
    return dict(session.execute(select(Node.name, Node.state).where(condition).order_by(Node.name)).all())  # type: ignore[arg-type]


def _suspects_first(suspects: list[str], job_nodes: Iterable[str]) -> list[str]:
    """Nodes an operator may name instead: the incident's suspects first, then the job's other nodes."""
    return suspects + sorted(n for n in job_nodes if n not in suspects)


def override_choices(session: Session, *, incident_id: int) -> list[str]:
    """The override list of an incident's decision card, read on its own (after an htmx action)."""
    suspects = [s["node"] for s in session.scalar(select(Incident.suspects).where(Incident.id == incident_id)) or []]
    return _suspects_first(suspects, _job_nodes(session, incident_id=incident_id, suspects=suspects))


def _silence(session: Session, *, silence_id: int) -> SilenceView | None:
    s = session.get(Silence, silence_id)
    if s is None:
        return None
    return SilenceView(s.id, s.node_pattern, s.job_pattern, s.expired_at or s.ends_at, s.author, s.comment)


# --- evidence, shaped for reading ---


def _short(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        ts = plots.parse_time(value) if len(value) >= 19 and value[10:11] == "T" else None
        if ts is not None:
            return f"{ts.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        return value if 0 < len(value) <= 80 else None
    if isinstance(value, list) and value and all(isinstance(v, int | str) and not isinstance(v, bool) for v in value):
        text = ", ".join(str(v) for v in value[:8]) + (f" (+{len(value) - 8})" if len(value) > 8 else "")
        return text if len(text) <= 120 else None
    return None


def numbers(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The evidence's short scalar fields (counts, rates, ratios, codes) as label/value pairs."""
    out = []
    for key, value in evidence.items():
        if key in _NOT_NUMBERS or key in ("signals", "lines", "messages", "why"):
            continue
        text = _short(value)
        if text is not None:
            out.append((key.replace("_", " "), text))
    return out


def _gpu_subject(finding: FindingOut) -> str:
    unit = finding.evidence.get("unit") or finding.subject
    node, _, gpu = str(unit).rpartition("/")
    return f"{node} GPU {gpu}" if node else str(unit)


def charts(finding: FindingOut) -> list[Chart]:
    """Plots for a finding with window series: peers (every metric), fail-slow rounds (step time, CPU)."""
    ev = finding.evidence
    out = []
    if finding.detector == "peers":
        for m in ev.get("metrics") or []:
            if not isinstance(m, Mapping):
                continue
            metric = str(m.get("metric", "?"))
            plot = plots.window_plot(
                plots.windows_from(m.get("windows") or []), title=metric, unit=plots.unit_of(metric)
            )
            if plot:
                direction = m.get("direction")
                out.append(Chart(finding, _gpu_subject(finding), metric, direction, plot, "peers' median"))
    elif finding.detector == "failslow" and isinstance(ev.get("rounds"), list) and ev["rounds"]:
        first = ev["rounds"][0] if isinstance(ev["rounds"][0], Mapping) else {}
        who = finding.subject if finding.subject_kind == "rank" else "the job"
        if "rank_ms" in first:
            windows, metric, unit, ref = plots.windows_from(ev["rounds"], value="rank_ms"), "step time", "ms", "peers'"
        elif "rank_cpu_pct" in first:
            windows, metric, unit, ref = plots.windows_from(ev["rounds"], value="rank_cpu_pct"), "CPU", "%", "peers'"
        elif "step_s" in first:
            baseline = ev.get("baseline_step_s")
            windows = plots.windows_from(
                ev["rounds"], value="step_s", baseline=baseline if isinstance(baseline, int | float) else None
            )
            metric, unit, ref = "seconds per step", "s", "the job's usual pace"
        else:
            return []
        plot = plots.window_plot(windows, title=metric, unit=unit)
        if plot:
            reference = f"{ref} median" if ref == "peers'" else ref
            out.append(Chart(finding, who, metric, ev.get("direction"), plot, reference))
    return out


def _tree(raw: Any, depth: int = 0) -> TreeNode | None:
    if not isinstance(raw, Mapping):
        return None
    children = raw.get("children") if isinstance(raw.get("children"), list) else []
    node = TreeNode(name=str(raw.get("name", "?")), count=int(raw.get("count") or 0), children=[])
    if depth >= TREE_DEPTH:
        node.cut = bool(children)
        return node
    node.children = [c for c in (_tree(c, depth + 1) for c in children) if c is not None]
    return node


def _paths(node: TreeNode, trail: list[TreeNode]) -> Iterable[list[TreeNode]]:
    if not node.children:
        yield trail
    for child in node.children:
        yield from _paths(child, [*trail, child])


def _matched(path: list[TreeNode], frames: list[str]) -> int:
    """How many of the culprit's frames (innermost first) this root-to-leaf path ends with; a '... N frames ...'
    gap the detector put in a deep stack counts as the rest matching."""
    n = 0
    for node, frame in zip(reversed(path), frames, strict=False):
        if node.name.startswith("... ") and node.name.endswith(" frames ..."):
            return len(frames)
        if node.name != frame:
            break
        n += 1
    return n


def stack_tree(raw: Any, culprit_frames: Any) -> TreeNode | None:
    """The merged stack tree, depth-limited, with the culprit's path marked and the busy branches open."""
    root = _tree(raw)
    if root is None:
        return None
    frames = [str(f) for f in culprit_frames] if isinstance(culprit_frames, list) else []
    if frames:
        best, best_n = None, 0
        for path in _paths(root, []):
            n = _matched(path, frames)
            if n > best_n and (n == len(frames) or n == len(path)):
                best, best_n = path, n
        for node in best or []:
            node.outlier = True
    _open(root, root.count)
    return root


def _open(node: TreeNode, total: int) -> None:
    node.open = node.outlier or node.count * 2 >= total
    node.shared = node.outlier and node.count >= total
    for child in node.children:
        _open(child, total)


def _groups(raw: Any, dominant: Any) -> list[StackGroupRow]:
    rows = []
    for g in raw if isinstance(raw, list) else []:
        if not isinstance(g, Mapping):
            continue
        nodes = [str(n) for n in g.get("nodes") or []]
        rows.append(
            StackGroupRow(
                signature=str(g.get("signature", "")),
                state=str(g.get("state", "")),
                op=str(g.get("op", "")),
                ranks=str(g.get("ranks", "")),
                count=int(g.get("count") or 0),
                node_count=int(g.get("node_count") or len(nodes)),
                nodes=nodes,
                frames=[str(f) for f in g.get("frames") or []],
                outlier=dominant is not None and g.get("signature") != dominant,
            )
        )
    return rows


def stack_views(findings: Iterable[FindingOut]) -> list[StackView]:
    """The stack analyses behind the stacks detector's findings, each once (it names one finding per machine)."""
    views: dict[str, StackView] = {}
    for f in findings:
        ev = f.evidence
        if f.detector != "stacks" or not (ev.get("groups") or ev.get("tree")):
            continue
        key = str(ev.get("stack_request") or json.dumps(ev.get("groups"), sort_keys=True, default=str))
        if key in views:
            views[key].findings.append(f)
            continue
        covering = ev.get("covering_group")
        views[key] = StackView(
            findings=[f],
            method=str(ev.get("method") or ""),
            why=str(ev.get("why") or ""),
            dominant=ev.get("dominant"),
            dominant_state=ev.get("dominant_state"),
            culprit_ranks=str(ev.get("culprit_ranks") or ""),
            culprit_state=ev.get("culprit_state"),
            covering_group=(
                f"{covering.get('dim', '?')} group of ranks {covering.get('ranks', '?')}"
                if isinstance(covering, Mapping)
                else None
            ),
            unreported=str(ev.get("unreported") or ""),
            ranks_reporting=ev.get("ranks_reporting") if isinstance(ev.get("ranks_reporting"), int) else None,
            signals_omitted=int(ev.get("signals_omitted") or 0),
            groups=_groups(ev.get("groups"), ev.get("dominant")),
            tree=stack_tree(ev.get("tree"), ev.get("culprit_frames")),
        )
    return list(views.values())


# --- timeline ---


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
    dumps: list[tuple[int, datetime, str | None, int | None, str | None]],
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
        for s in f.evidence.get("signals") or []:
            if not isinstance(s, Mapping) or s.get("type") not in ("metric", "process"):
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
            else:
                title, detail = f"process of rank {s.get('rank', '?')}", f"{node or ''}{span}".strip()
            out.append(Entry(at=at, kind="signal", title=title, detail=detail, nodes=[node] if node else []))
    return out


def _merge(entries: list[Entry]) -> list[Entry]:
    """Signals of one kind within a second of the first (15 ranks' watchdog timeouts, interleaved with their
    exceptions) become one line."""
    out: list[Entry] = []
    open_groups: dict[str, Entry] = {}
    for e in entries:
        group = open_groups.get(e.title) if e.kind == "signal" else None
        if group is not None and e.at - group.at <= timedelta(seconds=1):
            group.count += 1
            group.nodes += [n for n in e.nodes if n not in group.nodes]
            continue
        if e.kind == "signal":
            open_groups[e.title] = e
        out.append(e)
    return out


def _capped(entries: list[Entry], limit: int) -> tuple[list[Entry], int]:
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


def _timeline(
    incident: IncidentOut,
    *,
    logs: list[LogLine],
    dumps: list[tuple[int, datetime, str | None, int | None, str | None]],
    findings: list[FindingOut],
) -> list[Entry]:
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
    if incident.resolved_at is not None:
        entries.append(
            Entry(at=incident.resolved_at, kind="incident", title="resolved", detail=incident.resolution or "")
        )
    entries.sort(key=lambda e: (e.at, _ORDER[e.kind]))
    return _merge(entries)
