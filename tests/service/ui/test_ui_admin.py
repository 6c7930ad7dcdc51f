"""Channels and tokens in the web UI: forms that create, buttons that delete, test, retry and revoke; who may."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import ApiToken, NotificationChannel, NotificationDelivery
from service.notify import tasks
from tests import rows
from tests.conftest import bearer, count, sign_in
from tests.receiver import Receiver, receiver

SECRET = "T0123456789/B1001010101/7IsoQTrixdUtE971O1xQTm4T"


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Send tasks that would have gone to the broker."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(tasks.send_due, "apply_async", lambda args=(), kwargs=None, **options: calls.append(options))
    return calls


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        r.default = (200, {}, {})
        yield r


def _channel(
    session: Session, name: str, url: str = f"https://hooks.slack.com/services/{SECRET}", **values: Any
) -> NotificationChannel:
    row = NotificationChannel(name=name, kind=values.pop("kind", "slack"), url=url, **values)
    session.add(row)
    session.flush()
    return row


def _failed_delivery(session: Session, channel: NotificationChannel, key: str) -> NotificationDelivery:
    incident = rows.incident(session, job=rows.job(session))
    row = NotificationDelivery(
        channel_id=channel.id,
        event_key=key,
        event="opened",
        incident_id=incident.id,
        payload={"event": "opened", "incident_id": incident.id},
        state="failed",
        attempts=8,
        last_error="HTTP 404: no_service",
    )
    session.add(row)
    session.flush()
    return row


# ---- channels ----


def test_add_a_channel_through_the_form_and_see_it_masked(ui, session) -> None:
    url = f"https://hooks.slack.com/services/{SECRET}"
    response = ui.post(
        "/channels",
        {
            "name": "gpu-oncall",
            "kind": "slack",
            "url": url,
            "group_wait_s": "10",
            "rate_limit_per_minute": "",
            "enabled": "on",
        },
    )
    assert response.status_code == 303, response.text
    row = session.scalars(select(NotificationChannel).where(NotificationChannel.name == "gpu-oncall")).one()
    assert row.url == url and row.kind == "slack" and row.enabled
    assert row.group_wait_s == 10 and row.rate_limit_per_minute == 10  # blank: the API's default
    assert row.author == "operator:oncall-op"
    page = ui.get("/channels")
    assert page.status_code == 200
    assert "gpu-oncall" in page.text and "https://hooks.slack.com/…Tm4T" in page.text
    assert SECRET not in page.text  # neither in the list nor in the flash


def test_a_disallowed_host_is_refused_with_the_reason_and_adds_nothing(ui, app, session) -> None:
    app.state.settings = app.state.settings.model_copy(update={"webhook_allowed_hosts": ["hooks.slack.com"]})
    before = count(session, "notification_channels")
    response = ui.post("/channels", {"name": "evil", "kind": "slack", "url": f"https://evil.example.com/hook/{SECRET}"})
    assert response.status_code == 422
    text = html.unescape(response.text)
    assert "'evil.example.com' is not allowed" in text and 'class="form-error"' in text
    assert SECRET not in text  # the URL is not echoed back, not even into the form
    assert 'value="evil"' in text  # the name is, to be fixed rather than typed again
    assert count(session, "notification_channels") == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "c", "kind": "teams", "url": "https://hooks.slack.com/x/y"}, "kind: Input should be"),
        ({"name": "c", "kind": "slack", "url": "ftp://hooks.slack.com/x/y"}, "http:// or https://"),
        (
            {"name": "c", "kind": "slack", "url": "https://hooks.slack.com/x/y", "rate_limit_per_minute": "0"},
            "rate_limit_per_minute",
        ),
        ({"name": "c", "kind": "slack", "url": "https://hooks.slack.com/x/y", "group_wait_s": "soon"}, "group_wait_s"),
        ({"name": "", "kind": "slack", "url": "https://hooks.slack.com/x/y"}, "name"),
    ],
)
def test_bad_channels_are_422_and_add_nothing(ui, session, fields, message) -> None:
    before = count(session, "notification_channels")
    response = ui.post("/channels", fields)
    assert response.status_code == 422
    assert message in html.unescape(response.text)
    assert count(session, "notification_channels") == before


def test_a_taken_name_is_a_409(ui, session) -> None:
    _channel(session, "gpu-oncall")
    response = ui.post("/channels", {"name": "gpu-oncall", "kind": "json", "url": "https://example.com/hook"})
    assert response.status_code == 409
    assert "exists already" in html.unescape(response.text)
    assert count(session, "notification_channels") == 1


def test_send_test_disable_and_delete(ui, session, hook) -> None:
    channel = _channel(session, "local", url=f"{hook.url}/hook/secret", kind="json")
    response = ui.post(f"/channels/{channel.id}/test")
    assert response.status_code == 303
    assert len(hook.requests) == 1 and hook.requests[0]["body"]["events"][0]["event"] == "test"
    assert "answered HTTP 200" in html.unescape(ui.get("/channels").text)  # the flash

    assert ui.post(f"/channels/{channel.id}/enabled", {"enabled": "false"}).status_code == 303
    session.refresh(channel)
    assert not channel.enabled
    assert "chan-off" in ui.get("/channels").text

    assert ui.post(f"/channels/{channel.id}/delete").status_code == 303
    assert count(session, "notification_channels") == 0


def test_a_failed_test_says_why(ui, session, hook) -> None:
    hook.default = (404, {"error": "no_service"}, {})
    channel = _channel(session, "gone", url=f"{hook.url}/hook/secret", kind="slack")
    assert ui.post(f"/channels/{channel.id}/test").status_code == 303
    assert "failed: HTTP 404" in html.unescape(ui.get("/channels").text)


def test_failed_deliveries_are_listed_and_retried(ui, session, enqueued) -> None:
    a, b = _channel(session, "a-chan"), _channel(session, "b-chan", url="https://hooks.slack.com/services/b")
    da, db = _failed_delivery(session, a, "incident:1:opened"), _failed_delivery(session, b, "incident:2:opened")
    page = ui.get("/channels")
    assert f'id="delivery-{da.id}"' in page.text and f'id="delivery-{db.id}"' in page.text
    assert "HTTP 404: no_service" in page.text
    only_a = ui.get(f"/channels?channel={a.id}")
    assert f'id="delivery-{da.id}"' in only_a.text and f'id="delivery-{db.id}"' not in only_a.text
    response = ui.post(f"/channels/deliveries/{da.id}/retry", {"return_to": f"/channels?channel={a.id}"})
    assert response.status_code == 303 and response.headers["location"] == f"/channels?channel={a.id}"
    session.refresh(da)
    assert da.state == "pending" and da.attempts == 0
    assert len(enqueued) == 1  # the sender is woken, after the commit
    # Sent deliveries are never posted twice: the refusal is shown with its status, nothing changes.
    da.state = "sent"
    session.flush()
    refused = ui.post(f"/channels/deliveries/{da.id}/retry")
    assert refused.status_code == 409 and "never posted twice" in refused.text
    session.refresh(da)
    assert da.state == "sent"


def test_channel_forms_need_the_csrf_token(ui, session) -> None:
    channel = _channel(session, "keep")
    before = count(session, "notification_channels")
    assert ui.client.post("/channels", data={"name": "x", "kind": "json", "url": "https://e.com/h"}).status_code == 403
    assert ui.client.post(f"/channels/{channel.id}/delete", data={"csrf_token": "forged"}).status_code == 403
    assert count(session, "notification_channels") == before


def test_channels_page_query_count_does_not_grow(ui, session, count_queries) -> None:
    for k in range(3):
        _failed_delivery(session, _channel(session, f"few-{k}", url=f"https://hooks.slack.com/services/f{k}"), "k")
    with count_queries() as few:
        assert ui.get("/channels").status_code == 200
    for k in range(30):
        _failed_delivery(session, _channel(session, f"many-{k}", url=f"https://hooks.slack.com/services/m{k}"), "k")
    with count_queries() as many:
        page = ui.get("/channels")
    assert "many-29" in page.text
    assert many.count == few.count


# ---- tokens ----


def test_operators_may_not_see_or_touch_tokens(ui, session) -> None:
    target = session.scalars(select(ApiToken).where(ApiToken.name == "oncall-op")).one()
    page = ui.get("/tokens")
    assert page.status_code == 403 and "for admins" in page.text
    assert 'href="/tokens"' not in ui.get("/").text  # not in the navigation either
    before = count(session, "api_tokens")
    created = ui.post("/tokens", {"scope": "admin", "name": "escalate"})
    assert created.status_code == 403 and "fl_" not in created.text
    assert count(session, "api_tokens") == before
    revoked = ui.post(f"/tokens/{target.id}/revoke")
    assert revoked.status_code == 403
    session.refresh(target)
    assert target.revoked_at is None


def test_admin_creates_a_token_shown_once_that_works(admin_ui, client, session) -> None:
    response = admin_ui.post("/tokens", {"scope": "scheduler", "name": "k8s adapter", "ttl": "30", "unit": "days"})
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    match = re.search(r'<pre class="token-value" id="new-token">(fl_[^<]+)</pre>', response.text)
    assert match, "the token is on the result page"
    token = match.group(1)
    assert 'class="secret"' in response.text and "never be shown again" in response.text
    row = session.scalars(select(ApiToken).where(ApiToken.name == "k8s adapter")).one()
    assert row.scope == "scheduler" and row.prefix == token[:10] and token not in row.token_hash
    assert timedelta(days=29) < row.expires_at - datetime.now(UTC) <= timedelta(days=30)
    # Never again.
    again = admin_ui.get("/tokens")
    assert again.status_code == 200 and token not in again.text and "k8s adapter" in again.text
    assert row.prefix in again.text
    # It really works against the API, with its own scope.
    assert client.get("/api/v1/nodes", headers=bearer(token)).status_code == 200
    assert client.get("/api/v1/tokens", headers=bearer(token)).status_code == 403


def test_an_agent_token_bound_to_a_node(admin_ui, session) -> None:
    response = admin_ui.post("/tokens", {"scope": "agent", "name": "agent n17", "node_name": "gpu-node-017"})
    assert response.status_code == 201
    row = session.scalars(select(ApiToken).where(ApiToken.name == "agent n17")).one()
    assert row.node_name == "gpu-node-017" and row.expires_at is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scope": "scheduler", "name": "x", "node_name": "gpu-node-1"}, "only agent tokens can be bound to a node"),
        ({"scope": "root", "name": "x"}, "scope: Input should be"),
        ({"scope": "agent", "name": "x", "node_name": "bad node!"}, "node_name"),
        ({"scope": "agent", "name": "x", "ttl": "forever", "unit": "days"}, "is not a number"),
        ({"scope": "agent", "name": "x", "ttl": "0", "unit": "days"}, "greater than 0"),
    ],
)
def test_bad_tokens_are_refused_and_create_nothing(admin_ui, session, fields, message) -> None:
    before = count(session, "api_tokens")
    response = admin_ui.post("/tokens", fields)
    assert response.status_code == 422
    assert message in html.unescape(response.text)
    assert 'class="secret"' not in response.text
    assert count(session, "api_tokens") == before


def test_revoke_a_token(admin_ui, client, session, make_token) -> None:
    token = make_token("scheduler", name="old adapter")
    row = session.scalars(select(ApiToken).where(ApiToken.name == "old adapter")).one()
    page = admin_ui.get("/tokens?state=active")
    assert f'action="/tokens/{row.id}/revoke"' in page.text
    response = admin_ui.post(f"/tokens/{row.id}/revoke", {"return_to": "/tokens?state=active"})
    assert response.status_code == 303 and response.headers["location"] == "/tokens?state=active"
    session.refresh(row)
    assert row.revoked_at is not None
    assert client.get("/api/v1/nodes", headers=bearer(token)).status_code == 401
    assert f'id="token-{row.id}"' not in admin_ui.get("/tokens?state=active").text
    revoked = admin_ui.get("/tokens?state=revoked").text
    assert f'id="token-{row.id}"' in revoked and f'action="/tokens/{row.id}/revoke"' not in revoked
    assert admin_ui.post("/tokens/999999/revoke").status_code == 404


def test_token_forms_need_the_csrf_token(admin_ui, session, make_token) -> None:
    make_token("scheduler", name="victim")
    row = session.scalars(select(ApiToken).where(ApiToken.name == "victim")).one()
    before = count(session, "api_tokens")
    assert admin_ui.client.post("/tokens", data={"scope": "admin", "name": "sneaky"}).status_code == 403
    assert admin_ui.client.post(f"/tokens/{row.id}/revoke", data={"csrf_token": "forged"}).status_code == 403
    assert count(session, "api_tokens") == before
    session.refresh(row)
    assert row.revoked_at is None


def test_token_filters_pages_and_query_count(admin_ui, session, make_token, count_queries) -> None:
    for k in range(3):
        make_token("scheduler", name=f"sched-{k}")
    with count_queries() as few:
        assert admin_ui.get("/tokens").status_code == 200
    for k in range(120):
        make_token("agent", node=f"gpu-node-{k:03d}", name=f"agent-{k:03d}")
    with count_queries() as many:
        first = admin_ui.get("/tokens")
    assert many.count == few.count
    assert "agent-119" in first.text and "sched-0" not in first.text  # 100 a page, newest first
    match = re.search(r'<a href="([^"]*)" rel="next">', first.text)
    assert match
    second = admin_ui.get(html.unescape(match.group(1)))
    assert "sched-0" in second.text and "agent-119" not in second.text
    schedulers = admin_ui.get("/tokens?scope=scheduler").text
    assert "sched-2" in schedulers and "agent-001" not in schedulers
    assert admin_ui.get("/tokens?scope=root").status_code == 422
    make_token("operator", name="lapsed", expires_at=datetime.now(UTC) - timedelta(days=1))
    expired = admin_ui.get("/tokens?state=expired").text
    assert "lapsed" in expired and "sched-0" not in expired and "tstate-expired" in expired
    assert "lapsed" not in admin_ui.get("/tokens?state=active").text


def test_an_admin_signed_in_beside_an_operator_sees_the_tokens_link(client, make_token) -> None:
    admin = sign_in(client, make_token("admin", name="boss"))
    assert 'href="/tokens"' in admin.get("/").text
