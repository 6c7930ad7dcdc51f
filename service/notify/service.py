"""Chat notifications: incident events into the outbox, channel management, and the deliveries API."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Row, case, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import enqueue_after_commit
from service.errors import Conflict, InvalidInput, NotFound
from service.models import Decision, Incident, Job, Node, NotificationChannel, NotificationDelivery
from service.models.notify import FLEET_EVENTS, INCIDENT_EVENTS, NODE_EVENTS
from service.notify import formats, outbound, sender
from service.notify.schemas import (
    ChannelIn,
    ChannelOut,
    ChannelPage,
    ChannelTestResult,
    ChannelUpdate,
    DeliveryOut,
    DeliveryPage,
)
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined
from service.security import Principal

_TOP_SUSPECTS = 3
# The first send waits for the group window; this much more and the rows are surely due when it runs.
_SEND_SLACK_S = 0.5


# ---- incident events into the outbox ----


def record_incident_event(
    session: Session, *, incident: Incident, event: str, decisions: Sequence[Decision] = (), now: datetime
) -> int:
    """Queue a chat message about an incident on every enabled channel, once per (event, channel).

    Runs in the caller's transaction; the send task goes out after it commits. Returns the rows written
    (0 when every channel already has this event, when there is no enabled channel, or for a silenced incident).
    """
    if event not in INCIDENT_EVENTS:
        raise ValueError(f"unknown incident event {event!r}; expected one of {', '.join(INCIDENT_EVENTS)}")
    if event == "decided" and not decisions:
        raise ValueError("a 'decided' event needs the decisions it announces")
    # A maintenance window's incidents are recorded but alert nobody.
    if incident.silence_id is not None:
        return 0
    channels = _enabled_channels(session)
    if not channels:
        return 0
    session.flush()  # ids of a new incident and its decisions
    decision_id = min(d.id for d in decisions) if event == "decided" else None
    event_key = (
        f"incident:{incident.id}:decided:{decision_id}" if event == "decided" else f"incident:{incident.id}:{event}"
    )
    payload = snapshot(session, incident=incident, event=event, decisions=decisions, now=now, settings=get_settings())
    payload["event_key"] = event_key
    links = {"incident_id": incident.id, "decision_id": decision_id}
    return _queue(session, channels, event=event, event_key=event_key, payload=payload, now=now, **links)


def record_node_event(
    session: Session, *, node: Node, event: str, key: str, payload: dict[str, Any], now: datetime
) -> int:
    """Queue a chat message about a node on every enabled channel, once per (event, key, channel): `key` names the
    occurrence (its node_events row), so the same occurrence never alerts twice and a later one alerts again.
    Returns the rows written."""
    if event not in NODE_EVENTS:
        raise ValueError(f"unknown node event {event!r}; expected one of {', '.join(NODE_EVENTS)}")
    channels = _enabled_channels(session)
    if not channels:
        return 0
    event_key = f"node:{node.id}:{event}:{key}"
    body = {
        **payload,
        "event": event,
        "event_key": event_key,
        "time": now.isoformat(),
        "node": node.name,
        "url": f"{get_settings().public_url.rstrip('/')}/nodes/{node.name}",
    }
    return _queue(session, channels, event=event, event_key=event_key, payload=body, now=now)


def record_fleet_event(
    session: Session, *, event: str, key: str, payload: dict[str, Any], path: str, now: datetime
) -> int:
    """Queue a chat message about the fleet (a shared cause) on every enabled channel, once per (event, key,
    channel); `path` is the UI page it links to. Returns the rows written."""
    if event not in FLEET_EVENTS:
        raise ValueError(f"unknown fleet event {event!r}; expected one of {', '.join(FLEET_EVENTS)}")
    channels = _enabled_channels(session)
    if not channels:
        return 0
    event_key = f"fleet:{event}:{key}"
    body = {
        **payload,
        "event": event,
        "event_key": event_key,
        "time": now.isoformat(),
        "url": f"{get_settings().public_url.rstrip('/')}{path}",
    }
    return _queue(session, channels, event=event, event_key=event_key, payload=body, now=now)


def _enabled_channels(session: Session) -> Sequence[Row[tuple[int, float]]]:
    """(id, group wait) of every enabled channel: an event with none queues nothing."""
    return session.execute(
        select(NotificationChannel.id, NotificationChannel.group_wait_s).where(NotificationChannel.enabled)
    ).all()


def _queue(
    session: Session,
    channels: Sequence[Row[tuple[int, float]]],
    *,
    event: str,
    event_key: str,
    payload: dict[str, Any],
    now: datetime,
    **links: int | None,
) -> int:
    """One outbox row per channel (none where the channel already has `event_key`); the rows written."""
    written = session.scalars(
        insert(NotificationDelivery)
        .values(
            [
                {
                    "channel_id": channel_id,
                    "event_key": event_key,
                    "event": event,
                    "payload": payload,
                    "next_attempt_at": now + timedelta(seconds=group_wait_s),
                    **links,
                }
                for channel_id, group_wait_s in channels
            ]
        )
        .on_conflict_do_nothing(index_elements=["channel_id", "event_key"])
        .returning(NotificationDelivery.id)
    ).all()
    if written:
        _enqueue_send(session, countdown=min(group_wait_s for _, group_wait_s in channels) + _SEND_SLACK_S)
    return len(written)


def _enqueue_send(session: Session, *, countdown: float = 0.0) -> None:
    """Run the sender after commit; the beat pass every 2 s would find the rows too, only later."""
    # Imported here: the Celery app reads the broker settings, which code that only records events
    # (diagnosis, acknowledgements, their tests) should not need at import time.
    from service.notify import tasks

    enqueue_after_commit(session, tasks.send_due.signature(countdown=countdown))


def snapshot(
    session: Session,
    *,
    incident: Incident,
    event: str,
    decisions: Sequence[Decision],
    now: datetime,
    settings: Settings,
) -> dict[str, Any]:
    """What the message says, frozen when the event happens (later changes to the incident do not rewrite it)."""
    job = session.scalar(select(Job.external_id).where(Job.id == incident.job_id))
    if not decisions:
        decisions = session.scalars(
            select(Decision).where(Decision.incident_id == incident.id).order_by(Decision.id)
        ).all()
    node_ids = {d.node_id for d in decisions if d.node_id is not None}
    nodes = dict(session.execute(select(Node.id, Node.name).where(Node.id.in_(node_ids))).all()) if node_ids else {}
    return {
        "event": event,
        "time": now.isoformat(),
        "incident_id": incident.id,
        "job": job,
        "state": incident.state,
        "root_cause": incident.root_cause,
        "blame": incident.blame,
        "severity": incident.severity,
        "confidence": round(float(incident.confidence or 0.0), 4),
        "summary": incident.summary,
        "suspects": [
            {
                "node": s.get("node"),
                "confidence": s.get("confidence"),
                "action": s.get("action"),
                "reason": formats.clip(str(s.get("reason") or ""), 300),
            }
            for s in (incident.suspects or [])[:_TOP_SUSPECTS]
        ],
        "decisions": [
            {
                "id": d.id,
                "kind": d.kind,
                "node": nodes.get(d.node_id) if d.node_id is not None else None,
                "gpu": d.gpu,
                "gpu_pci": d.gpu_pci,
                "state": d.state,
                "confidence": round(float(d.confidence), 4),
                "reason": formats.clip(d.reason, 500),
            }
            for d in sorted(decisions, key=lambda d: d.id)
        ],
        "url": incident_url(settings, incident.id),
    }


def incident_url(settings: Settings, incident_id: int) -> str:
    """The incident's page in the web UI."""
    return f"{settings.public_url.rstrip('/')}/incidents/{incident_id}"


# ---- channels ----


def _check_url(url: str, settings: Settings) -> None:
    problem = sender.url_problem(url, allowed_hosts=settings.webhook_allowed_hosts) or outbound.creation_problem(
        url, settings.webhook_allowed_private
    )
    if problem is not None:
        raise InvalidInput(f"url: {problem}", details=[{"field": "body.url", "message": problem}])


def create_channel(session: Session, *, channel_in: ChannelIn, principal: Principal, settings: Settings) -> ChannelOut:
    """Add a channel; its URL must be http(s) on an allowed host. A taken name is a 409."""
    _check_url(channel_in.url, settings)
    channel_id = session.scalar(
        insert(NotificationChannel)
        .values(**channel_in.model_dump(), author=principal.actor)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(NotificationChannel.id)
    )
    if channel_id is None:
        raise Conflict(f"a channel named {channel_in.name!r} exists already")
    return to_out(_get_channel(session, channel_id), counts=_delivery_counts(session, [channel_id]))


def list_channels(session: Session) -> ChannelPage:
    channels = session.scalars(select(NotificationChannel).order_by(NotificationChannel.name)).all()
    counts = _delivery_counts(session, [c.id for c in channels])
    return ChannelPage(items=[to_out(c, counts=counts) for c in channels])


def get_channel(session: Session, *, channel_id: int) -> ChannelOut:
    return to_out(_get_channel(session, channel_id), counts=_delivery_counts(session, [channel_id]))


def update_channel(
    session: Session, *, channel_id: int, channel_update: ChannelUpdate, settings: Settings
) -> ChannelOut:
    """Change only the fields given; a new URL passes the same checks as at creation."""
    channel = _get_channel(session, channel_id, lock=True)
    changes = channel_update.model_dump(exclude_unset=True)
    for name in ("enabled", "group_wait_s", "rate_limit_per_minute", "url"):
        if name in changes and changes[name] is None:
            raise InvalidInput(f"{name} may not be null", details=[{"field": f"body.{name}", "message": "null"}])
    if "url" in changes:
        _check_url(changes["url"], settings)
    for name, value in changes.items():
        setattr(channel, name, value)
    session.flush()
    return to_out(channel, counts=_delivery_counts(session, [channel.id]))


def delete_channel(session: Session, *, channel_id: int) -> None:
    """Remove a channel and its deliveries."""
    session.delete(_get_channel(session, channel_id, lock=True))
    session.flush()


def send_test(
    session: Session, *, channel_id: int, settings: Settings, now: datetime, http_client: httpx.Client | None = None
) -> ChannelTestResult:
    """Post one test message now, outside the outbox (also to a disabled channel, to check it before enabling)."""
    channel = _get_channel(session, channel_id)
    _check_url(channel.url, settings)
    payload = {
        "event": "test",
        "time": now.isoformat(),
        "summary": f"Channel {channel.name} is set up: faultline incident alerts will arrive here.",
        "url": f"{settings.public_url.rstrip('/')}/incidents",
    }
    body = formats.render(channel.kind, [payload])
    key = f"test-{channel.id}-{int(now.timestamp() * 1000)}"
    if http_client is None:
        with outbound.client(settings) as client:
            outcome = sender.post(client, kind=channel.kind, url=channel.url, body=body, message_key=key)
    else:
        outcome = sender.post(http_client, kind=channel.kind, url=channel.url, body=body, message_key=key)
    # The status only, never the receiver's words: a test must not make the service a reader of other pages.
    error = f"HTTP {outcome.status_code}" if outcome.status_code is not None and not outcome.ok else outcome.error
    return ChannelTestResult(delivered=outcome.ok, status_code=outcome.status_code, error=None if outcome.ok else error)


def _get_channel(session: Session, channel_id: int, *, lock: bool = False) -> NotificationChannel:
    query = select(NotificationChannel).where(NotificationChannel.id == channel_id)
    channel = session.scalar(query.with_for_update(key_share=True) if lock else query)
    if channel is None:
        raise NotFound(f"no channel {channel_id}")
    return channel


def _delivery_counts(session: Session, channel_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    if not channel_ids:
        return {}
    waiting = func.count(case((NotificationDelivery.state.in_(("pending", "sending")), 1)))
    failed = func.count(case((NotificationDelivery.state == "failed", 1)))
    rows = session.execute(
        select(NotificationDelivery.channel_id, waiting, failed)
        .where(NotificationDelivery.channel_id.in_(channel_ids))
        .group_by(NotificationDelivery.channel_id)
    ).all()
    return {channel_id: (int(w), int(f)) for channel_id, w, f in rows}


def to_out(channel: NotificationChannel, *, counts: dict[int, tuple[int, int]]) -> ChannelOut:
    """The channel as the API shows it: its URL masked, its (waiting, failed) deliveries from `counts`."""
    pending, failed = counts.get(channel.id, (0, 0))
    return ChannelOut.model_validate(Joined(channel, url=sender.mask_url(channel.url), pending=pending, failed=failed))


# ---- deliveries ----


def list_deliveries(
    session: Session,
    *,
    state: str | None,
    channel_id: int | None,
    incident_id: int | None,
    limit: int,
    cursor: str | None,
) -> DeliveryPage:
    """Newest first, keyset-paginated on id."""
    query = (
        select(NotificationDelivery, NotificationChannel.name)
        .join(NotificationChannel, NotificationChannel.id == NotificationDelivery.channel_id)
        .order_by(NotificationDelivery.id.desc())
    )
    if state:
        query = query.where(NotificationDelivery.state == state)
    if channel_id is not None:
        query = query.where(NotificationDelivery.channel_id == channel_id)
    if incident_id is not None:
        query = query.where(NotificationDelivery.incident_id == incident_id)
    if cursor:
        query = query.where(NotificationDelivery.id < decode_cursor(cursor))
    rows = session.execute(query.limit(limit + 1)).all()
    items = [DeliveryOut.model_validate(Joined(d, channel=name)) for d, name in rows[:limit]]
    return DeliveryPage(items=items, next_cursor=encode_cursor(rows[limit - 1][0].id) if len(rows) > limit else None)


def retry_delivery(session: Session, *, delivery_id: int, now: datetime) -> DeliveryOut:
    """Put a failed delivery back in the outbox with a fresh set of attempts (a pending one is left as it is)."""
    row = session.scalar(select(NotificationDelivery).where(NotificationDelivery.id == delivery_id).with_for_update())
    if row is None:
        raise NotFound(f"no delivery {delivery_id}")
    if row.state == "sent":
        raise Conflict(f"delivery {delivery_id} was sent already; it is never posted twice")
    if row.state == "sending":
        raise Conflict(f"delivery {delivery_id} is being sent right now")
    if row.state == "failed":
        # last_error stays: it says why the delivery needed a hand.
        row.state, row.attempts, row.next_attempt_at, row.claimed_at = "pending", 0, now, None
        session.flush()
        _enqueue_send(session)
    name = session.scalar(select(NotificationChannel.name).where(NotificationChannel.id == row.channel_id)) or ""
    return DeliveryOut.model_validate(Joined(row, channel=name))
