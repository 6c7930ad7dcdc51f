"""A silenced subject produces findings but no decisions and no chat messages; suspects and deliveries follow
the incident's state changes otherwise."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from service.config import get_settings
from service.diagnosis.service import diagnose_job
from service.models import Decision, Finding, Incident, Node, NotificationChannel, NotificationDelivery, Silence
from tests.service.diagnosis.test_diagnosis_service import _kernel, _ship, _xid79


def _silence(session, **patterns: str) -> Silence:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    silence = Silence(
        starts_at=now - timedelta(minutes=1),
        ends_at=now + timedelta(hours=1),
        author="alice",
        comment="GPU firmware upgrade",
        **patterns,
    )
    session.add(silence)
    session.flush()
    return silence


def _channel(session) -> NotificationChannel:  # type: ignore[no-untyped-def]
    channel = NotificationChannel(name=f"oncall-{uuid.uuid4().hex[:6]}", kind="json", url="http://127.0.0.1:9/hook")
    session.add(channel)
    session.flush()
    return channel


def test_a_silenced_job_keeps_its_findings_but_decides_and_announces_nothing(client, session, make_token) -> None:
    channel = _channel(session)
    token, job = make_token("agent"), f"maint-{uuid.uuid4().hex[:6]}"
    silence = _silence(session, job_pattern="maint-*")
    _ship(client, token, job, {2: _kernel(_xid79())})

    result = diagnose_job(session, job_id=job, settings=get_settings())
    assert result.new_findings >= 1 and result.decisions == []
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(result.incidents))).all()
    assert incident.silence_id == silence.id
    assert session.scalars(select(Finding).where(Finding.incident_id == incident.id)).all()
    assert session.scalars(select(Decision).where(Decision.incident_id == incident.id)).all() == []
    deliveries = select(NotificationDelivery).where(NotificationDelivery.channel_id == channel.id)
    assert session.scalars(deliveries).all() == []
    assert session.scalar(select(Node.state).where(Node.name == "node-2")) == "healthy"


def test_a_silenced_node_is_not_evicted_while_the_others_are(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    _silence(session, node_pattern="node-0")
    _ship(client, token, job, {0: _kernel(_xid79(0x1A)), 3: _kernel(_xid79(0x3B))})
    settings = get_settings().model_copy(update={"policy_max_evict_share_per_hour": 1})
    result = diagnose_job(session, job_id=job, settings=settings)
    evicted = session.scalars(
        select(Node.name).join(Decision, Decision.node_id == Node.id).where(Decision.id.in_(result.decisions))
    ).all()
    assert evicted == ["node-3"]


def test_an_unsilenced_fault_announces_opened_and_decided_once_and_marks_the_suspect(
    client, session, make_token
) -> None:
    channel = _channel(session)
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, token, job, {1: _kernel(_xid79())})
    for _ in range(2):  # the second pass is idempotent: no new event
        diagnose_job(session, job_id=job, settings=get_settings())
    events = session.scalars(
        select(NotificationDelivery.event)
        .where(NotificationDelivery.channel_id == channel.id)
        .order_by(NotificationDelivery.id)
    ).all()
    assert events == ["opened", "decided"]
    assert session.scalar(select(Node.state).where(Node.name == "node-1")) == "suspect"


def test_when_the_window_ends_the_incident_is_announced_and_decided(client, session, make_token) -> None:
    channel = _channel(session)
    token, job = make_token("agent"), f"maint-{uuid.uuid4().hex[:6]}"
    silence = _silence(session, job_pattern=job)
    _ship(client, token, job, {2: _kernel(_xid79())})
    assert diagnose_job(session, job_id=job, settings=get_settings()).decisions == []

    silence.expired_at = datetime.now(UTC) - timedelta(seconds=1)
    session.flush()
    result = diagnose_job(session, job_id=job, settings=get_settings())
    assert len(result.decisions) == 1
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(result.incidents))).all()
    assert incident.silence_id is None
    events = session.scalars(
        select(NotificationDelivery.event).where(NotificationDelivery.channel_id == channel.id)
    ).all()
    assert sorted(events) == ["decided", "opened"]
