"""Planned maintenance windows: announce, list, cancel; and the beat's pass that acts on them.

A window's life, on the beat's clock (`tick`):
- `maintenance_lead_s` before it starts: the job running on the node is asked to checkpoint (a `checkpoint`
  directive its agents pass to the training side), the node is drained (a `cordon` decision through the normal
  decision path, so the scheduler adapters act), and a node silence covers it from then to its end plus
  `maintenance_grace_s`, so the node going down (heartbeats stop, errors) decides, accuses and alerts nothing;
- once it is over and the node's agent reports again after its end: the silence ends and the node enters its return
  gate (`nodes.lifecycle.enter_returning`: the stop-time checks, whose pass tells the scheduler to take it back).

Incidents its silence covered count neither against a job's ETTR nor in the fleet's repair figures
(service/jobs/ettr.py, service/fleet/service.py read `maintenance_silences`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import Conflict, InvalidInput, NotFound
from service.incidents import service as incidents
from service.models import Decision, Directive, Incident, Job, MaintenanceWindow, Node, NodeEvent, Silence
from service.nodes import lifecycle
from service.nodes import service as nodes
from service.pagination import decode_cursor, encode_cursor
from service.planned.schemas import CloudEventIn, WindowIn, WindowOut, WindowPage, WindowState

ACTOR = "faultline maintenance"
OPERATOR = "operator"
# A window announced as starting a little in the past (a clock, a slow form) is still "now"; more is a mistake.
START_SLACK = timedelta(minutes=5)
# A checkpoint request is delivered at least this long, even when the window starts sooner.
MIN_CHECKPOINT_TTL = timedelta(minutes=5)


def state_of(window: MaintenanceWindow, *, now: datetime) -> WindowState:
    if window.cancelled_at is not None:
        return "cancelled"
    if window.returned_at is not None:
        return "over"
    if window.starts_at <= now:
        return "in_progress"
    return "prepared" if window.prepared_at is not None else "announced"


def to_out(window: MaintenanceWindow, *, node: str, now: datetime) -> WindowOut:
    return WindowOut(
        id=window.id,
        node=node,
        starts_at=window.starts_at,
        ends_at=window.ends_at,
        reason=window.reason,
        source=window.source,
        external_id=window.external_id,
        author=window.author,
        created_at=window.created_at,
        state=state_of(window, now=now),
        prepared_at=window.prepared_at,
        returned_at=window.returned_at,
        cancelled_at=window.cancelled_at,
        cancelled_by=window.cancelled_by,
        silence_id=window.silence_id,
        checkpoint_directive_id=window.checkpoint_directive_id,
    )


def _check_times(starts_at: datetime, ends_at: datetime, *, now: datetime) -> None:
    if ends_at <= starts_at:
        raise InvalidInput(f"ends_at {ends_at.isoformat()} must be after starts_at {starts_at.isoformat()}")
    if ends_at <= now:
        raise InvalidInput(f"the window ended already ({ends_at.isoformat()} is in the past): announce a future one")
    if starts_at < now - START_SLACK:
        raise InvalidInput(
            f"starts_at {starts_at.isoformat()} is in the past: a window already under way starts now "
            f"({now.isoformat()})"
        )


def _overlapping(
    session: Session, *, node: Node, starts_at: datetime, ends_at: datetime, skip: int | None = None
) -> MaintenanceWindow | None:
    query = select(MaintenanceWindow).where(
        MaintenanceWindow.node_id == node.id,
        MaintenanceWindow.cancelled_at.is_(None),
        MaintenanceWindow.returned_at.is_(None),
        MaintenanceWindow.starts_at < ends_at,
        MaintenanceWindow.ends_at > starts_at,
    )
    if skip is not None:
        query = query.where(MaintenanceWindow.id != skip)
    return session.scalar(query.limit(1))


def announce(session: Session, *, name: str, window_in: WindowIn, actor: str, now: datetime) -> WindowOut:
    """A person announces a node's window; 404 for an unknown node, 422 for a window in the past or ending before it
    starts, 409 when it overlaps one already announced."""
    _check_times(window_in.starts_at, window_in.ends_at, now=now)
    node = nodes.get_by_name(session, name=name, lock=True)
    other = _overlapping(session, node=node, starts_at=window_in.starts_at, ends_at=window_in.ends_at)
    if other is not None:
        raise Conflict(
            f"node {name} has maintenance window {other.id} from {other.starts_at.isoformat()} to "
            f"{other.ends_at.isoformat()} already: cancel it first or pick another time"
        )
    window = MaintenanceWindow(
        node_id=node.id,
        starts_at=window_in.starts_at,
        ends_at=window_in.ends_at,
        reason=window_in.reason,
        source=OPERATOR,
        author=actor,
        created_at=now,
    )
    session.add(window)
    session.flush()
    return to_out(window, node=node.name, now=now)


def get(session: Session, *, name: str, window_id: int, lock: bool = False) -> tuple[MaintenanceWindow, Node]:
    """The node's window; `lock`: row-locked (the beat's pass locks windows before their nodes; so does this)."""
    node = nodes.get_by_name(session, name=name)
    window = session.get(MaintenanceWindow, window_id, with_for_update=lock, populate_existing=lock)
    if window is None or window.node_id != node.id:
        raise NotFound(f"node {name} has no maintenance window {window_id}")
    return window, node


def list_windows(
    session: Session, *, name: str | None, current: bool, limit: int, cursor: str | None, now: datetime
) -> WindowPage:
    """Windows, newest first; of one node; `current`: only those not over nor cancelled."""
    query = (
        select(MaintenanceWindow, Node.name)
        .join(Node, Node.id == MaintenanceWindow.node_id)
        .order_by(MaintenanceWindow.id.desc())
        .limit(limit + 1)
    )
    if name is not None:
        query = query.where(MaintenanceWindow.node_id == nodes.get_by_name(session, name=name).id)
    if current:
        query = query.where(MaintenanceWindow.cancelled_at.is_(None), MaintenanceWindow.returned_at.is_(None))
    if cursor is not None:
        query = query.where(MaintenanceWindow.id < decode_cursor(cursor))
    rows = session.execute(query).all()
    page = rows[:limit]
    return WindowPage(
        items=[to_out(w, node=n, now=now) for w, n in page],
        next_cursor=encode_cursor(page[-1][0].id) if len(rows) > limit else None,
    )


def cancel(session: Session, *, name: str, window_id: int, actor: str, now: datetime) -> WindowOut:
    """Cancel a window (idempotent). One already acted on ends its silence and its checkpoint request, and a node it
    drained goes back through its return gate."""
    window, node = get(session, name=name, window_id=window_id, lock=True)
    if window.cancelled_at is not None or window.returned_at is not None:
        return to_out(window, node=node.name, now=now)
    window.cancelled_at, window.cancelled_by = now, actor
    if window.prepared_at is not None:
        node = nodes.get_by_name(session, name=name, lock=True)
        _give_back(session, window=window, node=node, why=f"window cancelled by {actor}", now=now)
    session.flush()
    return to_out(window, node=node.name, now=now)


def _node_pattern(name: str) -> str:
    """The silence's pattern matching exactly this node (fnmatch's wildcards, were a name to hold one, escaped)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def report_cloud(
    session: Session, *, name: str, provider: str, events: Sequence[CloudEventIn], now: datetime
) -> tuple[list[WindowOut], list[int]]:
    """The node's agent lists its cloud's scheduled events: each becomes (or updates) a window with source
    `cloud:<provider>`; a window of that provider the cloud no longer lists and that has not started is cancelled
    (rescheduled events come back under their new time). Events already over are skipped."""
    source = f"cloud:{provider}"
    for event in events:
        if event.ends_at <= event.starts_at:
            raise InvalidInput(f"event {event.event_id}: ends_at must be after starts_at")
    node_id = nodes.get_by_name(session, name=name).id
    # The windows before their node, in the beat's order (tick), so the two never wait on each other.
    existing = {
        w.external_id: w
        for w in session.scalars(
            select(MaintenanceWindow)
            .where(MaintenanceWindow.node_id == node_id, MaintenanceWindow.source == source)
            .order_by(MaintenanceWindow.id)
            .with_for_update()
        )
    }
    node = nodes.get_by_name(session, name=name, lock=True)
    listed: list[MaintenanceWindow] = []
    for event in events:
        if event.ends_at <= now:
            continue
        reason = f"{provider} scheduled event {event.event_id}" + (
            f": {event.description}" if event.description else ""
        )
        window = existing.get(event.event_id)
        if window is None:
            window = MaintenanceWindow(
                node_id=node.id, source=source, external_id=event.event_id, author=f"agent:{name}", created_at=now
            )
            session.add(window)
        elif window.cancelled_at is not None or window.returned_at is not None:
            listed.append(window)
            continue
        window.starts_at, window.ends_at, window.reason = event.starts_at, event.ends_at, reason[:1000]
        if window.silence_id is not None:  # moved while drained: the silence follows its end
            silence = session.get(Silence, window.silence_id)
            if silence is not None:
                silence.ends_at = max(silence.ends_at, event.ends_at)
        listed.append(window)
    seen = {e.event_id for e in events}
    cancelled: list[int] = []
    for event_id, window in existing.items():
        if event_id in seen or window.cancelled_at is not None or window.returned_at is not None:
            continue
        if window.starts_at > now:
            window.cancelled_at, window.cancelled_by = now, f"{source}: no longer scheduled"
            if window.prepared_at is not None:
                _give_back(session, window=window, node=node, why=f"{source} withdrew the event", now=now)
            cancelled.append(window.id)
    session.flush()
    return [to_out(w, node=node.name, now=now) for w in listed], cancelled


@dataclass(frozen=True, slots=True)
class Span:
    """When a node is under planned maintenance for faultline: from its drain (or the window's start) until the
    window's end plus the grace (the node coming back up), cut short by a cancellation or its return."""

    window_id: int
    starts_at: datetime
    ends_at: datetime


def maintenance_spans(
    session: Session, *, since: datetime, until: datetime, settings: Settings
) -> dict[str, list[Span]]:
    """Node -> its maintenance spans overlapping [since, until]: what a node going down for announced maintenance
    shows then is the maintenance, not a fault (shared causes leave it out)."""
    grace = timedelta(seconds=settings.maintenance_grace_s)
    rows = session.execute(
        select(Node.name, MaintenanceWindow)
        .join(Node, Node.id == MaintenanceWindow.node_id)
        .where(
            func.least(MaintenanceWindow.starts_at, MaintenanceWindow.prepared_at) <= until,  # least skips a null
            MaintenanceWindow.ends_at + grace >= since,
        )
    ).all()
    spans: dict[str, list[Span]] = {}
    for name, w in rows:
        start = min(w.starts_at, w.prepared_at or w.starts_at)
        end = min(t for t in (w.ends_at + grace, w.cancelled_at, w.returned_at) if t is not None)
        if end > start:  # a window cancelled before it began covered nothing
            spans.setdefault(name, []).append(Span(w.id, start, end))
    return spans


def covering(spans: dict[str, list[Span]], *, node: str, at: datetime) -> Span | None:
    """The span of `spans` (maintenance_spans) holding `node` at `at`, if any."""
    return next((s for s in spans.get(node, ()) if s.starts_at <= at <= s.ends_at), None)


@dataclass
class TickResult:
    prepared: list[int] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)


def tick(session: Session, *, settings: Settings, now: datetime) -> TickResult:
    """Act on the windows due: drain ahead of those starting within the lead time, return the nodes of those over
    whose agents report again. Idempotent; windows another worker holds are skipped (SKIP LOCKED)."""
    result = TickResult()
    lead = timedelta(seconds=settings.maintenance_lead_s)
    due = session.scalars(
        select(MaintenanceWindow)
        .where(
            MaintenanceWindow.returned_at.is_(None),
            MaintenanceWindow.cancelled_at.is_(None),
            MaintenanceWindow.starts_at <= now + lead,
        )
        .order_by(MaintenanceWindow.starts_at, MaintenanceWindow.id)
        .with_for_update(skip_locked=True)
    ).all()
    for window in due:
        if window.prepared_at is None and now < window.ends_at:
            _prepare(session, window=window, now=now, settings=settings)
            result.prepared.append(window.id)
        if now >= window.ends_at and _back(session, window=window):
            [node] = lifecycle.lock(session, names=[_name(session, window)])
            _give_back(session, window=window, node=node, why="maintenance over, its agent reports again", now=now)
            result.returned.append(window.id)
    session.flush()
    return result


def _name(session: Session, window: MaintenanceWindow) -> str:
    return session.scalar(select(Node.name).where(Node.id == window.node_id)) or ""


def _back(session: Session, *, window: MaintenanceWindow) -> bool:
    """Over for faultline once the node's agent reports after the window's end (a window never prepared, passed
    while nobody ran the beat, has nothing to give back)."""
    if window.prepared_at is None:
        return True
    seen = session.scalar(select(Node.last_seen_at).where(Node.id == window.node_id))
    return seen is not None and seen > window.ends_at


def _prepare(session: Session, *, window: MaintenanceWindow, now: datetime, settings: Settings) -> None:
    """Ask the node's job to checkpoint, silence the node for the window, and drain it."""
    [node] = lifecycle.lock(session, names=[_name(session, window)])
    why = f"planned maintenance from {window.starts_at.isoformat()} to {window.ends_at.isoformat()}: {window.reason}"
    job = session.get(Job, node.current_job_id) if node.current_job_id is not None else None
    directive = None
    if job is not None:
        directive = Directive(
            job_id=job.id,
            kind="checkpoint",
            reason=f"node {node.name}: {why}"[:1000],
            requested_by=ACTOR,
            purpose="maintenance",
            params={"deadline": window.starts_at.isoformat(), "node": node.name, "window_id": window.id},
            created_at=now,
            expires_at=max(window.starts_at, now + MIN_CHECKPOINT_TTL),
        )
        session.add(directive)
    silence = Silence(
        node_pattern=_node_pattern(node.name),
        starts_at=now,
        ends_at=window.ends_at + timedelta(seconds=settings.maintenance_grace_s),
        author=ACTOR,
        comment=f"maintenance window {window.id}: {why}"[:2000],
    )
    session.add(silence)
    session.flush()
    window.prepared_at, window.silence_id = now, silence.id
    window.checkpoint_directive_id = str(directive.id) if directive is not None else None
    details = {"window_id": window.id, "checkpoint_directive": window.checkpoint_directive_id, "silence": silence.id}
    if node.state in lifecycle.CORDON_FROM:
        lifecycle.record(
            session,
            node=node,
            kind="maintenance_drain",
            source="maintenance",
            actor=ACTOR,
            now=now,
            to_state="cordoned",
            reason=f"planned maintenance (window {window.id}): {window.reason}"[:500],
            job_id=job.id if job is not None else None,
            details=details,
        )
        nodes.tell_schedulers(
            session,
            node=node,
            kind="cordon",
            reason=f"planned maintenance (window {window.id}): {why}",
            actor=ACTOR,
            now=now,
            ttl_s=settings.decision_ttl_s,
        )
        session.flush()
        cordon = session.scalar(
            select(Decision)
            .where(Decision.node_id == node.id, Decision.kind == "cordon", Decision.state == "pending")
            .order_by(Decision.id.desc())
            .limit(1)
        )
        if cordon is not None:  # which window it drains for: the decision's evidence, as an incident's would be
            cordon.evidence = {
                **cordon.evidence,
                "maintenance_window": window.id,
                "starts_at": window.starts_at.isoformat(),
            }
    else:  # out of service already (cordoned, evicted, in repair): nothing to drain, the window is in its history
        lifecycle.record(
            session,
            node=node,
            kind="maintenance_drain",
            source="maintenance",
            actor=ACTOR,
            now=now,
            reason=f"planned maintenance (window {window.id}), node already {node.state}: {window.reason}"[:500],
            details=details,
        )


def _give_back(session: Session, *, window: MaintenanceWindow, node: Node, why: str, now: datetime) -> None:
    """The window is over (or cancelled): end its silence and checkpoint request; a node it drained that is still
    cordoned enters its return gate (the level-2 checks; their pass tells the scheduler to take it back)."""
    window.returned_at = now
    if window.silence_id is not None:
        silence = session.get(Silence, window.silence_id)
        if silence is not None and (silence.expired_at is None or silence.expired_at > now):
            silence.expired_at = max(now, silence.starts_at)
        # What the node's going down opened is over with the window: left open, it would still accuse the node (its
        # return gate's pass would make it a suspect). Silenced incidents name only nodes of the window.
        covered = session.scalars(
            select(Incident).where(Incident.silence_id == window.silence_id, Incident.state != "resolved")
        ).all()
        for incident in covered:
            incidents.resolve(
                session, incident=incident, resolution=f"planned maintenance (window {window.id})", now=now
            )
    if window.checkpoint_directive_id is not None:
        directive = session.get(Directive, window.checkpoint_directive_id)
        if directive is not None and directive.expires_at > now:
            directive.expires_at = now
    if window.prepared_at is None:
        return
    # Ours to give back only while the window's drain is still what holds it out: not a person's cordon, nor an
    # eviction, made since (those wait for a person or their own way back).
    last_move = session.execute(
        select(NodeEvent.kind, NodeEvent.details)
        .where(NodeEvent.node_id == node.id, NodeEvent.from_state.is_distinct_from(NodeEvent.to_state))
        .order_by(NodeEvent.at.desc(), NodeEvent.id.desc())
        .limit(1)
    ).first()
    drained = (
        last_move is not None
        and last_move.kind == "maintenance_drain"
        and (last_move.details or {}).get("window_id") == window.id
    )
    if node.state == "cordoned" and drained:
        gate = lifecycle.Gate(
            lifecycle.DRAINED_GATE_LEVEL, force=False, undrain=True, reason=f"window {window.id}: {why}"
        )
        lifecycle.enter_returning(
            session,
            node=node,
            kind="maintenance_over",
            source="maintenance",
            actor=ACTOR,
            reason=f"planned maintenance (window {window.id}) {why}"[:500],
            gate=gate,
            now=now,
            details={"window_id": window.id},
        )
    else:
        lifecycle.record(
            session,
            node=node,
            kind="maintenance_over",
            source="maintenance",
            actor=ACTOR,
            now=now,
            reason=f"planned maintenance (window {window.id}) {why}; node {node.state}, left as it is"[:500],
            details={"window_id": window.id},
        )
