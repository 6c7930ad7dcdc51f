"""/api/v1/tokens: admins create, list and revoke tokens; expiry and revocation as the API enforces them."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from tests.conftest import bearer, count

URL = "/api/v1/tokens"


@pytest.fixture
def admin(make_token: Any) -> dict[str, str]:
    return bearer(make_token("admin", name="root"))


def _create(client: TestClient, admin: dict[str, str], **body: Any) -> dict[str, Any]:
    response = client.post(URL, json=body, headers=admin)
    assert response.status_code == 201, response.text
    return response.json()


def test_admin_creates_a_token_that_works_and_is_shown_once(client, session, admin):
    created = _create(client, admin, scope="scheduler", name="k8s adapter", ttl_s=3600)
    token = created.pop("token")
    assert token.startswith("fl_") and len(token) > 40 and created["prefix"] == token[:10]
    assert created["scope"] == "scheduler" and created["name"] == "k8s adapter" and created["state"] == "active"
    expires_at = datetime.fromisoformat(created["expires_at"])
    assert timedelta(minutes=59) < expires_at - datetime.now(UTC) <= timedelta(hours=1)
    # The new token authenticates, and with its own scope only.
    assert client.get("/api/v1/decisions", headers=bearer(token)).status_code == 200
    assert client.get(URL, headers=bearer(token)).status_code == 403
    # Never again: not in the listing, not in the record, and only its hash is stored.
    listing = client.get(URL, headers=admin)
    one = client.get(f"{URL}/{created['id']}", headers=admin)
    assert listing.status_code == 200 and one.status_code == 200
    assert token not in listing.text and token not in one.text
    assert one.json() == created
    assert [t["id"] for t in listing.json()] == sorted(t["id"] for t in listing.json())
    stored = session.execute(text("SELECT token_hash FROM api_tokens WHERE id = :id"), {"id": created["id"]}).scalar()
    assert stored and token not in stored and stored not in listing.text


def test_agent_token_bound_to_a_node(client, admin):
    created = _create(client, admin, scope="agent", node_name="gpu-node-017", expires_at="2030-01-01T00:00:00Z")
    assert created["node_name"] == "gpu-node-017"
    assert datetime.fromisoformat(created["expires_at"]) == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("scope", ["agent", "scheduler", "operator"])
def test_only_admins_create_list_or_revoke_tokens(client, session, make_token, scope):
    victim = make_token("admin")
    headers = bearer(make_token(scope))
    before = count(session, "api_tokens")
    response = client.post(URL, json={"scope": "admin", "name": "escalate"}, headers=headers)
    assert response.status_code == 403 and "admin" in response.json()["message"]
    assert count(session, "api_tokens") == before
    assert client.get(URL, headers=headers).status_code == 403
    assert client.delete(f"{URL}/1", headers=headers).status_code == 403
    assert client.get("/api/v1/decisions", headers=bearer(victim)).status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"scope": "root"}, "body.scope"),
        ({"scope": "scheduler", "node_name": "gpu-node-001"}, "only agent tokens can be bound to a node"),
        ({"scope": "agent", "node_name": "bad node!"}, "body.node_name"),
        ({"scope": "agent", "ttl_s": 60, "expires_at": "2030-01-01T00:00:00Z"}, "not both"),
        ({"scope": "agent", "ttl_s": 0}, "ttl_s"),
        ({"scope": "agent", "expires_at": "2001-01-01T00:00:00Z"}, "not in the future"),
        ({"scope": "agent", "expires_at": "2099-01-01T00:00:00"}, "body.expires_at: Input should have timezone"),
        ({"scope": "agent", "token": "fl_chosen-by-me"}, "body.token: Extra inputs"),
    ],
)
def test_bad_requests_are_422_and_create_nothing(client, session, admin, body, message):
    before = count(session, "api_tokens")
    response = client.post(URL, json=body, headers=admin)
    assert response.status_code == 422
    assert message in response.json()["message"]
    assert count(session, "api_tokens") == before


def test_revoke_is_idempotent_and_keeps_the_record(client, admin):
    created = _create(client, admin, scope="scheduler")
    first = client.delete(f"{URL}/{created['id']}", headers=admin)
    assert first.status_code == 200 and first.json()["state"] == "revoked" and first.json()["revoked_at"]
    again = client.delete(f"{URL}/{created['id']}", headers=admin)
    assert again.status_code == 200 and again.json() == first.json()
    assert client.get(f"{URL}/{created['id']}", headers=admin).json()["state"] == "revoked"
    assert client.delete(f"{URL}/999999", headers=admin).status_code == 404
    assert client.get(f"{URL}/999999", headers=admin).status_code == 404


@pytest.fixture
def second_process(app: Any) -> Iterator[TestClient]:
    """Another API process on the same database: its own token cache."""
    from service.app import create_app

    with TestClient(create_app(app.state.settings, factory=app.state.sessionmaker)) as other:
        yield other


def test_revocation_reaches_every_process_within_the_cache_time(client, second_process, admin):
    token = _create(client, admin, scope="scheduler")
    headers = bearer(token["token"])
    assert client.get("/api/v1/decisions", headers=headers).status_code == 200
    assert client.delete(f"{URL}/{token['id']}", headers=admin).status_code == 200
    # A process that has not cached the token rejects it at once...
    response = second_process.get("/api/v1/decisions", headers=headers)
    assert response.status_code == 401 and response.json()["message"] == "token revoked"
    # ...one that has keeps accepting it until its cache entry is older than token_cache_seconds (the
    # documented bound), then rejects it too.
    assert client.get("/api/v1/decisions", headers=headers).status_code == 200
    client.app.state.token_cache._entries.clear()
    assert client.get("/api/v1/decisions", headers=headers).status_code == 401


def test_an_expired_token_is_401_and_listed_as_expired(client, session, admin):
    token = _create(client, admin, scope="scheduler", ttl_s=3600)
    headers = bearer(token["token"])
    assert client.get("/api/v1/decisions", headers=headers).status_code == 200
    _expire(session, token["id"])
    client.app.state.token_cache._entries.clear()
    assert client.get("/api/v1/decisions", headers=headers).json()["message"] == "token expired"
    listed = {t["id"]: t["state"] for t in client.get(URL, headers=admin).json()}
    assert listed[token["id"]] == "expired"


def test_a_token_cached_before_its_expiry_is_refused_after_it(client, session):
    from service.tokens import service as tokens

    new = tokens.create(session, scope="scheduler", expires_at=datetime.now(UTC) + timedelta(hours=1))
    headers = bearer(new.token)
    assert client.get("/api/v1/decisions", headers=headers).status_code == 200
    # Expiry is checked on every request against the cached expiry time: move the cached entry's clock.
    cache = client.app.state.token_cache
    deadline, principal, problem = cache._entries[new.token]
    past = dataclasses.replace(principal, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    cache._entries[new.token] = (deadline, past, problem)
    response = client.get("/api/v1/decisions", headers=headers)
    assert response.status_code == 401 and response.json()["message"] == "token expired"


def _expire(session: Session, token_id: int) -> None:
    session.execute(
        text("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE id = :id"), {"id": token_id}
    )
    session.flush()


def test_cli_list_shows_expired_and_revoked_tokens(committed, capsys):
    from service.cli import run
    from service.tokens import service as tokens

    with Session(committed) as session:
        live = tokens.create(session, scope="scheduler", name="live")
        old = tokens.create(session, scope="agent", name="old", ttl=timedelta(seconds=-1))
        gone = tokens.create(session, scope="operator", name="gone")
        tokens.revoke(session, token_id=gone.record.id)
        session.commit()
    assert run(argparse.Namespace(command="token", token_command="list", data_dir=None)) == 0
    out = capsys.readouterr().out
    states = {line.split("\t")[4]: line.split("\t")[5] for line in out.splitlines()}
    assert states == {"live": "active", "old": "expired", "gone": "revoked"}
    assert all(t.token not in out for t in (live, old, gone))


def test_the_last_active_admin_token_cannot_be_revoked_through_the_api(client, session) -> None:
    from service.tokens import service as tokens

    only = tokens.create(session, scope="admin", name="only-admin")
    response = client.delete(f"/api/v1/tokens/{only.record.id}", headers=bearer(only.token))
    assert response.status_code == 409, response.text
    assert "last active admin token" in response.json()["message"]
    second = tokens.create(session, scope="admin", name="second-admin")
    assert client.delete(f"/api/v1/tokens/{only.record.id}", headers=bearer(second.token)).status_code == 200
    # The server's own CLI path may still revoke it: that is the way back from a lost admin token.
    assert tokens.revoke(session, token_id=second.record.id, keep_an_admin=False).revoked_at is not None
