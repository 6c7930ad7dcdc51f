"""The webhook outbox on the database: recording incident events, the sender's passes, and the channels API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings, get_settings
from service.embedded import free_port
from service.models import Decision, Incident, Job, Node, NotificationChannel, NotificationDelivery, Silence
from service.notify import sender, tasks
from service.notify.service import record_incident_event
from tests.conftest import bearer, count
from tests.receiver import Receiver, receiver

NOW = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
SLACK_SECRET = "T0AAAAAAA/B0BBBBBBB/s3cr3tTokenValueXyZ9"


# ---- rows ----


def make_incident(session: Session, *, severity: str = "critical", node: str | None = None) -> Incident:
    job = Job(external_id=f"llm-{uuid.uuid4().hex[:8]}", source="registered", world_size=16)
    session.add(job)
    session.flush()
    incident = Incident(
        job_id=job.id,
        root_cause="gpu_hardware",
        blame="infrastructure",
        severity=severity,
        confidence=0.97,
        summary="Xid 79 (GPU has fallen off the bus) on gpu-node-017 GPU 3",
        suspects=[
            {"node": f"gpu-node-{i:03d}", "confidence": 0.9 - i / 10, "action": "evict", "reason": "Xid 79"}
            for i in range(5)
        ],
    )
    session.add(incident)
    session.flush()
    return incident


def make_decision(session: Session, incident: Incident, *, node: str, kind: str = "evict") -> Decision:
    node_row = session.scalar(select(Node).where(Node.name == node))
    if node_row is None:
        node_row = Node(name=node)
        session.add(node_row)
        session.flush()
    decision = Decision(
        incident_id=incident.id,
        job_id=incident.job_id,
        node_id=node_row.id,
        kind=kind,
        state="pending",
        confidence=0.97,
        reason=f"{kind} {node}: Xid 79",
        evidence={},
    )
    session.add(decision)
    session.flush()
    return decision


def make_channel(
    session: Session,
    url: str,
    *,
    kind: str = "slack",
    group_wait_s: float = 0.0,
    rate_limit_per_minute: int = 10,
    enabled: bool = True,
) -> NotificationChannel:
    channel = NotificationChannel(
        name=f"{kind}-{uuid.uuid4().hex[:6]}",
        kind=kind,
        url=url,
        enabled=enabled,
        group_wait_s=group_wait_s,
        rate_limit_per_minute=rate_limit_per_minute,
    )
    session.add(channel)
    session.flush()
    return channel


def deliveries(session: Session, channel: NotificationChannel | None = None) -> list[NotificationDelivery]:
    """Fresh from the database (the sender writes through its own sessions)."""
    session.expire_all()
    query = select(NotificationDelivery).order_by(NotificationDelivery.id)
    if channel is not None:
        query = query.where(NotificationDelivery.channel_id == channel.id)
    return list(session.scalars(query))


def settings(**overrides: Any) -> Settings:
    return get_settings().model_copy(update={"webhook_retry_base_s": 2.0, "webhook_retry_max_s": 60.0, **overrides})


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as client:
        yield client


@pytest.fixture
def slack() -> Iterator[Receiver]:
    with receiver() as r:
        r.default = (200, {}, {})
        yield r


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Send tasks that would have gone to the broker, with their options."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(tasks.send_due, "apply_async", lambda args=(), kwargs=None, **options: calls.append(options))
    return calls


def send(factory: sessionmaker[Session], http: httpx.Client, now: datetime, **overrides: Any) -> sender.SendReport:
    return sender.send_due(factory, now=now, settings=settings(**overrides), http_client=http)


# ---- recording events ----


def test_record_writes_one_row_per_enabled_channel_once(session, enqueued):
    a = make_channel(session, "https://hooks.slack.com/services/a", group_wait_s=5)
    b = make_channel(session, "https://open.larksuite.com/hook/b", kind="lark", group_wait_s=2)
    make_channel(session, "https://hooks.slack.com/services/c", enabled=False)
    incident = make_incident(session)
    decision = make_decision(session, incident, node="gpu-node-017")

    assert record_incident_event(session, incident=incident, event="opened", now=NOW) == 2
    assert record_incident_event(session, incident=incident, event="opened", now=NOW) == 0

    rows = deliveries(session)
    assert [r.channel_id for r in rows] == [a.id, b.id]
    assert {r.event_key for r in rows} == {f"incident:{incident.id}:opened"}
    assert [r.next_attempt_at for r in rows] == [NOW + timedelta(seconds=5), NOW + timedelta(seconds=2)]
    payload = rows[0].payload
    job = session.get(Job, incident.job_id)
    assert payload["job"] == job.external_id
    assert payload["url"] == f"{get_settings().public_url.rstrip('/')}/incidents/{incident.id}"
    assert (payload["root_cause"], payload["blame"], payload["severity"]) == (
        "gpu_hardware",
        "infrastructure",
        "critical",
    )
    assert [s["node"] for s in payload["suspects"]] == ["gpu-node-000", "gpu-node-001", "gpu-node-002"]
    # No decisions passed: the incident's own are shown.
    assert payload["decisions"] == [
        {
            "id": decision.id,
            "kind": "evict",
            "node": "gpu-node-017",
            "state": "pending",
            "confidence": 0.97,
            "reason": "evict gpu-node-017: Xid 79",
            "gpu": None,  # a reset_gpu decision's GPU index
            "gpu_pci": None,  # or its PCI bus id, when the node's inventory lacks the index
        }
    ]
    assert enqueued == [], "nothing is sent before the transaction commits"


def test_decided_event_is_keyed_by_its_first_decision(session):
    make_channel(session, "https://hooks.slack.com/services/a")
    incident = make_incident(session)
    first = make_decision(session, incident, node="gpu-node-001")
    second = make_decision(session, incident, node="gpu-node-002")
    assert record_incident_event(session, incident=incident, event="decided", decisions=[second, first], now=NOW) == 1
    assert record_incident_event(session, incident=incident, event="decided", decisions=[first, second], now=NOW) == 0
    (row,) = deliveries(session)
    assert row.event_key == f"incident:{incident.id}:decided:{first.id}"
    assert row.decision_id == first.id
    assert [d["node"] for d in row.payload["decisions"]] == ["gpu-node-001", "gpu-node-002"]
    with pytest.raises(ValueError, match="needs the decisions"):
        record_incident_event(session, incident=incident, event="decided", now=NOW)
    with pytest.raises(ValueError, match="unknown incident event"):
        record_incident_event(session, incident=incident, event="closed", now=NOW)


def test_silenced_incident_and_no_channels_record_nothing(session):
    incident = make_incident(session)
    assert record_incident_event(session, incident=incident, event="opened", now=NOW) == 0  # no channel yet
    make_channel(session, "https://hooks.slack.com/services/a")
    silence = Silence(
        node_pattern="gpu-node-0*", starts_at=NOW, ends_at=NOW + timedelta(hours=1), author="a", comment=""
    )
    session.add(silence)
    session.flush()
    incident.silence_id = silence.id
    assert record_incident_event(session, incident=incident, event="opened", now=NOW) == 0
    assert deliveries(session) == []


def test_send_task_is_enqueued_after_commit_and_never_after_rollback(factory, enqueued):
    with factory() as session:
        make_channel(session, "https://hooks.slack.com/services/a", group_wait_s=3)
        incident = make_incident(session)
        record_incident_event(session, incident=incident, event="opened", now=NOW)
        assert enqueued == []
        session.commit()
    assert enqueued == [{"countdown": 3.5}]
    with factory() as session:
        incident = make_incident(session)
        record_incident_event(session, incident=incident, event="opened", now=NOW)
        session.rollback()
    assert len(enqueued) == 1


# ---- the sender ----


def test_events_of_the_same_seconds_go_out_as_one_message(session, factory, http, slack):
    channel = make_channel(session, slack.url, group_wait_s=5)
    incidents = [make_incident(session) for _ in range(3)]
    for i, incident in enumerate(incidents):
        record_incident_event(session, incident=incident, event="opened", now=NOW + timedelta(seconds=i))

    assert send(factory, http, NOW + timedelta(seconds=4)).messages == 0, "the oldest has not waited 5 s yet"
    report = send(factory, http, NOW + timedelta(seconds=5))
    assert (report.messages, report.sent) == (1, 3)
    (body,) = slack.bodies()
    for incident in incidents:
        assert f"/incidents/{incident.id}|Open incident #{incident.id}>" in str(body["blocks"])
    rows = deliveries(session, channel)
    assert {r.state for r in rows} == {"sent"}
    assert len({r.message_key for r in rows}) == 1
    assert [r.attempts for r in rows] == [1, 1, 1]

    assert send(factory, http, NOW + timedelta(minutes=10)).messages == 0
    assert len(slack.requests) == 1, "a sent delivery is never posted again"


def test_rate_limit_makes_the_next_message_wait_for_a_free_slot(session, factory, http, slack):
    channel = make_channel(session, slack.url, rate_limit_per_minute=1)
    first, second = make_incident(session), make_incident(session)
    record_incident_event(session, incident=first, event="opened", now=NOW)
    assert send(factory, http, NOW).sent == 1

    record_incident_event(session, incident=second, event="opened", now=NOW + timedelta(seconds=1))
    report = send(factory, http, NOW + timedelta(seconds=1))
    assert (report.messages, report.rate_limited) == (0, 1)
    waiting = deliveries(session, channel)[1]
    assert waiting.state == "pending"
    sent_at = deliveries(session, channel)[0].sent_at
    assert waiting.next_attempt_at == sent_at + timedelta(seconds=60)
    assert len(slack.requests) == 1

    assert send(factory, http, NOW + timedelta(seconds=59)).messages == 0
    assert send(factory, http, NOW + timedelta(seconds=61)).sent == 1
    assert len(slack.requests) == 2
    assert f"/incidents/{second.id}" in slack.bodies()[1]["text"]


def test_server_errors_are_retried_with_backoff_and_visible_in_the_api(
    session, factory, http, slack, client, make_token
):
    channel = make_channel(session, slack.url)
    incident = make_incident(session)
    record_incident_event(session, incident=incident, event="opened", now=NOW)
    slack.script = [(500, {"error": "internal"}, {}), (503, {}, {})]

    report = send(factory, http, NOW)
    assert (report.messages, report.retrying) == (1, 1)
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("pending", 1)
    assert row.last_error.startswith("HTTP 500")
    assert NOW + timedelta(seconds=1.6) <= row.next_attempt_at <= NOW + timedelta(seconds=2.5)
    assert send(factory, http, NOW + timedelta(seconds=1)).messages == 0, "not before the backoff"

    send(factory, http, NOW + timedelta(seconds=3))
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("pending", 2) and row.last_error.startswith("HTTP 503")
    assert row.next_attempt_at >= NOW + timedelta(seconds=3 + 3.2), "the second wait doubles"

    token = make_token("operator")
    listed = client.get("/api/v1/deliveries", params={"incident": incident.id}, headers=bearer(token)).json()
    (item,) = listed["items"]
    assert (item["state"], item["attempts"], item["last_error"]) == ("pending", 2, row.last_error)
    assert item["next_attempt_at"] is not None and item["channel"] == channel.name

    send(factory, http, NOW + timedelta(seconds=30))
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("sent", 3)
    assert len(slack.requests) == 3


def test_retryable_failures_give_up_after_max_attempts(session, factory, http, slack):
    channel = make_channel(session, slack.url)
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    slack.default = (502, {}, {})
    send(factory, http, NOW, webhook_max_attempts=2)
    send(factory, http, NOW + timedelta(minutes=5), webhook_max_attempts=2)
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("failed", 2) and row.last_error.startswith("HTTP 502")
    send(factory, http, NOW + timedelta(hours=1), webhook_max_attempts=2)
    assert len(slack.requests) == 2


def test_client_errors_fail_at_once(session, factory, http, slack):
    channel = make_channel(session, slack.url)
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    slack.default = (404, {"error": "no_service"}, {})
    report = send(factory, http, NOW)
    assert report.failed == 1
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("failed", 1)
    assert "HTTP 404" in row.last_error and "no_service" in row.last_error
    send(factory, http, NOW + timedelta(hours=1))
    assert len(slack.requests) == 1


def test_429_waits_as_long_as_retry_after_says(session, factory, http, slack):
    channel = make_channel(session, slack.url)
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    slack.script = [(429, {}, {"Retry-After": "30"})]
    send(factory, http, NOW)
    (row,) = deliveries(session, channel)
    assert row.state == "pending"
    assert NOW + timedelta(seconds=30) <= row.next_attempt_at <= NOW + timedelta(seconds=31)


def test_lark_error_codes_in_a_200_are_failures(session, factory, http):
    with receiver() as final, receiver() as throttled:
        final.default = (200, {"code": 19021, "msg": "sign match fail"}, {})
        throttled.script = [(200, {"code": 9499, "msg": "too many request"}, {})]
        throttled.default = (200, {"code": 0, "msg": "success"}, {})
        final_channel = make_channel(session, final.url, kind="lark")
        throttled_channel = make_channel(session, throttled.url, kind="lark")
        record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
        send(factory, http, NOW)

        (row,) = deliveries(session, final_channel)
        assert (row.state, row.last_error) == ("failed", "Lark code 19021: sign match fail")
        (row,) = deliveries(session, throttled_channel)
        assert (row.state, row.last_error) == ("pending", "Lark code 9499: too many request")

        send(factory, http, NOW + timedelta(minutes=5))
        (row,) = deliveries(session, throttled_channel)
        assert (row.state, row.attempts) == ("sent", 2)
        body = throttled.bodies()[-1]
        assert body["msg_type"] == "interactive"
        assert body["card"]["header"]["template"] == "red"
        assert len(final.requests) == 1


def test_unreachable_receiver_is_retried_and_its_url_never_logged(session, factory, http, caplog):
    url = f"http://127.0.0.1:{free_port()}/hook/{SLACK_SECRET}"
    channel = make_channel(session, url)
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    send(factory, http, NOW)
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("pending", 1)
    assert row.last_error.startswith("ConnectError")
    assert SLACK_SECRET not in row.last_error
    assert channel.name in caplog.text
    assert SLACK_SECRET not in caplog.text


def test_a_row_left_sending_by_a_killed_worker_is_failed_not_posted_again(
    session, factory, http, slack, client, make_token, enqueued
):
    channel = make_channel(session, slack.url)
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    (row,) = deliveries(session, channel)
    # A worker claimed it and died mid-POST (it may or may not have reached the receiver).
    row.state, row.claimed_at, row.attempts, row.message_key = "sending", NOW, 1, "msg-dead"
    session.flush()

    assert send(factory, http, NOW + timedelta(seconds=10)).messages == 0, "a live claim is left alone"
    report = send(factory, http, NOW + timedelta(minutes=10))
    assert (report.abandoned, report.messages) == (1, 0)
    (row,) = deliveries(session, channel)
    assert (row.state, row.last_error) == ("failed", sender.ABANDONED_ERROR)
    assert slack.requests == []

    token = make_token("operator")
    retried = client.post(f"/api/v1/deliveries/{row.id}/retry", headers=bearer(token))
    assert retried.status_code == 200
    assert (retried.json()["state"], retried.json()["attempts"]) == ("pending", 0)
    send(factory, http, datetime.now(UTC))
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("sent", 1)
    assert len(slack.requests) == 1
    assert client.post(f"/api/v1/deliveries/{row.id}/retry", headers=bearer(token)).status_code == 409
    assert client.post("/api/v1/deliveries/999999/retry", headers=bearer(token)).status_code == 404


def test_json_channel_gets_the_snapshots_with_an_idempotency_key(session, factory, http, slack):
    channel = make_channel(session, slack.url, kind="json")
    incident = make_incident(session)
    record_incident_event(session, incident=incident, event="opened", now=NOW)
    send(factory, http, NOW)
    (request,) = slack.requests
    (row,) = deliveries(session, channel)
    assert request["headers"]["Idempotency-Key"] == row.message_key
    assert request["body"]["version"] == "1"
    (event,) = request["body"]["events"]
    assert event["event_key"] == f"incident:{incident.id}:opened"
    assert event["url"].endswith(f"/incidents/{incident.id}")


def test_a_host_dropped_from_the_allow_list_is_never_posted_to(session, factory, http, slack):
    channel = make_channel(session, slack.url)
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    send(factory, http, NOW, webhook_allowed_hosts=["hooks.slack.com"])
    (row,) = deliveries(session, channel)
    assert row.state == "failed" and "not allowed" in row.last_error
    assert slack.requests == []


# ---- the channels API ----


def test_channels_crud_never_shows_the_url(client, make_token, session):
    token = make_token("operator")
    url = f"https://hooks.slack.com/services/{SLACK_SECRET}"
    created = client.post(
        "/api/v1/channels",
        json={"name": "gpu-oncall", "kind": "slack", "url": url, "group_wait_s": 2},
        headers=bearer(token),
    )
    assert created.status_code == 201, created.text
    channel = created.json()
    assert channel["url"] == "https://hooks.slack.com/…XyZ9"
    assert (channel["enabled"], channel["group_wait_s"], channel["rate_limit_per_minute"]) == (True, 2.0, 10)
    assert channel["author"].startswith("operator:")

    duplicate = client.post(
        "/api/v1/channels", json={"name": "gpu-oncall", "kind": "slack", "url": url}, headers=bearer(token)
    )
    assert duplicate.status_code == 409

    cid = channel["id"]
    patched = client.patch(f"/api/v1/channels/{cid}", json={"enabled": False, "url": url + "x"}, headers=bearer(token))
    assert patched.status_code == 200
    assert (patched.json()["enabled"], patched.json()["url"]) == (False, "https://hooks.slack.com/…yZ9x")
    assert session.get(NotificationChannel, cid).url == url + "x"

    responses = [
        created,
        duplicate,
        patched,
        client.get("/api/v1/channels", headers=bearer(token)),
        client.get(f"/api/v1/channels/{cid}", headers=bearer(token)),
        client.get("/openapi.json"),
    ]
    for response in responses:
        assert SLACK_SECRET not in response.text
        assert "s3cr3tTokenValue" not in response.text
    assert [c["name"] for c in responses[3].json()["items"]] == ["gpu-oncall"]

    assert client.delete(f"/api/v1/channels/{cid}", headers=bearer(token)).status_code == 204
    assert client.get(f"/api/v1/channels/{cid}", headers=bearer(token)).status_code == 404
    assert client.delete(f"/api/v1/channels/{cid}", headers=bearer(token)).status_code == 404


@pytest.mark.parametrize("scope", ["scheduler", "agent"])
def test_channels_and_deliveries_need_an_operator(client, make_token, scope):
    token = make_token(scope)
    assert client.get("/api/v1/channels", headers=bearer(token)).status_code == 403
    assert client.get("/api/v1/deliveries", headers=bearer(token)).status_code == 403
    body = {"name": "x", "kind": "slack", "url": "https://hooks.slack.com/services/x"}
    assert client.post("/api/v1/channels", json=body, headers=bearer(token)).status_code == 403
    assert client.get("/api/v1/channels").status_code == 401


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"kind": "slack", "url": "https://evil.example.com/hook/" + SLACK_SECRET},
            "'evil.example.com' is not allowed",
        ),
        ({"kind": "slack", "url": "ftp://hooks.slack.com/services/" + SLACK_SECRET}, "http:// or https://"),
        ({"kind": "teams", "url": "https://hooks.slack.com/services/" + SLACK_SECRET}, "body.kind"),
        ({"kind": "slack", "url": "https://hooks.slack.com/x", "rate_limit_per_minute": 0}, "rate_limit_per_minute"),
    ],
)
def test_bad_channels_are_422_and_change_nothing(factory, make_token, session, body, message):
    from service.app import create_app

    app = create_app(settings(webhook_allowed_hosts=["hooks.slack.com", "*.larksuite.com"]), factory=factory)
    token = make_token("admin")
    before = count(session, "notification_channels")
    with TestClient(app) as client:
        answer = client.post("/api/v1/channels", json={"name": "c", **body}, headers=bearer(token))
        assert answer.status_code == 422
        assert message in answer.text
        assert SLACK_SECRET not in answer.text
        assert count(session, "notification_channels") == before

        ok = client.post(
            "/api/v1/channels",
            json={"name": "ok", "kind": "lark", "url": "https://open.larksuite.com/hook/x"},
            headers=bearer(token),
        )
        assert ok.status_code == 201
        cid = ok.json()["id"]
        patched = client.patch(
            f"/api/v1/channels/{cid}",
            json={"url": "https://evil.example.com/hook/" + SLACK_SECRET},
            headers=bearer(token),
        )
        assert patched.status_code == 422 and SLACK_SECRET not in patched.text
        assert session.get(NotificationChannel, cid).url == "https://open.larksuite.com/hook/x"


def test_test_endpoint_posts_one_message_now(client, make_token, session, slack):
    token = make_token("operator")
    channel = make_channel(session, slack.url + "/hook/" + SLACK_SECRET, enabled=False)
    answer = client.post(f"/api/v1/channels/{channel.id}/test", headers=bearer(token))
    assert answer.json() == {"delivered": True, "status_code": 200, "error": None}
    (request,) = slack.requests
    assert request["path"] == "/hook/" + SLACK_SECRET
    assert request["body"]["blocks"][0]["text"]["text"] == "faultline test message"
    assert deliveries(session) == [], "a test message bypasses the outbox"

    slack.default = (403, {"error": "invalid_token"}, {})
    failed = client.post(f"/api/v1/channels/{channel.id}/test", headers=bearer(token)).json()
    # The status only: the receiver's reply is never shown (with a URL it should not reach, that would leak).
    assert failed == {"delivered": False, "status_code": 403, "error": "HTTP 403"}
    assert client.post("/api/v1/channels/999999/test", headers=bearer(token)).status_code == 404


def test_deliveries_filter_and_paginate(client, make_token, session):
    token = make_token("operator")
    a = make_channel(session, "https://hooks.slack.com/services/a")
    b = make_channel(session, "https://hooks.slack.com/services/b")
    incidents = [make_incident(session) for _ in range(3)]
    for incident in incidents:
        record_incident_event(session, incident=incident, event="opened", now=NOW)
    failed = deliveries(session, b)[0]
    failed.state, failed.last_error = "failed", "HTTP 404"
    session.flush()

    def get(**params: Any) -> dict[str, Any]:
        answer = client.get("/api/v1/deliveries", params=params, headers=bearer(token))
        assert answer.status_code == 200, answer.text
        return answer.json()

    page = get(limit=4)
    assert len(page["items"]) == 4 and page["next_cursor"]
    rest = get(limit=4, cursor=page["next_cursor"])
    assert len(rest["items"]) == 2 and rest["next_cursor"] is None
    ids = [d["id"] for d in page["items"] + rest["items"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 6

    assert {d["channel_id"] for d in get(channel=a.id)["items"]} == {a.id}
    assert [d["id"] for d in get(state="failed")["items"]] == [failed.id]
    assert {d["incident_id"] for d in get(incident=incidents[1].id)["items"]} == {incidents[1].id}
    assert client.get("/api/v1/deliveries", params={"state": "lost"}, headers=bearer(token)).status_code == 422
    assert client.get("/api/v1/deliveries", params={"cursor": "!!"}, headers=bearer(token)).status_code == 422

    channels = {c["id"]: c for c in client.get("/api/v1/channels", headers=bearer(token)).json()["items"]}
    assert (channels[a.id]["pending"], channels[a.id]["failed"]) == (3, 0)
    assert (channels[b.id]["pending"], channels[b.id]["failed"]) == (2, 1)


def test_a_slow_post_taken_for_abandoned_records_what_the_receiver_answered(session, factory):
    channel = make_channel(session, "https://hooks.slack.com/services/a")
    record_incident_event(session, incident=make_incident(session), event="opened", now=NOW)
    report = sender.SendReport()
    with factory() as claiming:
        claim = sender.claim_channel(claiming, channel_id=channel.id, now=NOW, settings=settings(), report=report)
        claiming.commit()
    assert claim is not None
    # The POST hangs past every timeout; another worker's sweep gives the claim up...
    with factory() as sweeping:
        assert sender.fail_abandoned(sweeping, now=NOW + timedelta(minutes=10), settings=settings()) == 1
        sweeping.commit()
    # ...then the receiver answers 200: the row says sent, so nobody retries it by hand into a duplicate.
    with factory() as recording:
        late = NOW + timedelta(minutes=10)
        ok = sender.Outcome(ok=True)
        sender.record_outcome(recording, claim=claim, outcome=ok, now=late, settings=settings(), report=report)
        recording.commit()
    (row,) = deliveries(session, channel)
    assert (row.state, row.attempts) == ("sent", 1)
