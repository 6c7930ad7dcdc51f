"""Agent enrolment: an enrolment token is exchanged once per node for that node's own agent token; refused when
reused for an enrolled node, expired, revoked, for a node outside its pattern, or when it is not an enrolment token."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.models import AgentEnrolment, ApiToken
from service.tokens import service as tokens
from tests.conftest import bearer, count

URL = "/api/v1/tokens/enrol"


@pytest.fixture
def enrol_token(make_token: Any) -> str:
    return make_token("enrol", name="rack 1-12", node_pattern="gpu-*")


def _batch(node: str) -> dict[str, Any]:
    return {"batch_id": str(uuid.uuid4()), "node": node, "sent_at": datetime.now(UTC).isoformat(), "heartbeat": {}}


def test_an_agent_exchanges_the_enrolment_token_for_its_own_node_bound_token(client, session, enrol_token):
    response = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(enrol_token))
    assert response.status_code == 201, response.text
    issued = response.json()
    assert issued["scope"] == "agent" and issued["node_name"] == "gpu-017" and issued["state"] == "active"
    record = session.get(ApiToken, issued["id"])
    assert record is not None and record.token_hash != issued["token"]  # stored as a hash only
    enrolment = session.scalar(select(AgentEnrolment).where(AgentEnrolment.node_name == "gpu-017"))
    assert enrolment is not None and enrolment.agent_token_id == issued["id"]
    # The new token is an agent token of its node: it may not write another node's data, nor use scheduler routes.
    node_token = bearer(issued["token"])
    assert client.post("/api/v1/ingest", json=_batch("gpu-018"), headers=node_token).status_code == 403
    assert client.get("/api/v1/decisions", headers=node_token).status_code == 403
    # And the enrolment token is good for nothing but enrolling.
    assert client.get("/api/v1/decisions", headers=bearer(enrol_token)).status_code == 403
    assert client.post("/api/v1/ingest", json=_batch("gpu-017"), headers=bearer(enrol_token)).status_code == 403


def test_many_nodes_enrol_with_one_enrolment_token(client, session, enrol_token):
    for node in ("gpu-001", "gpu-002", "gpu-003"):
        assert client.post(URL, json={"node_name": node}, headers=bearer(enrol_token)).status_code == 201
    bound = session.scalars(select(ApiToken.node_name).where(ApiToken.scope == "agent").order_by(ApiToken.node_name))
    assert list(bound) == ["gpu-001", "gpu-002", "gpu-003"]


def test_reused_for_an_enrolled_node_is_refused_until_its_token_is_revoked(client, session, enrol_token):
    first = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(enrol_token))
    assert first.status_code == 201
    agents_before = count(session, "api_tokens")
    again = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(enrol_token))
    assert again.status_code == 409
    assert "already enrolled" in again.json()["message"] and f"revoke {first.json()['id']}" in again.json()["message"]
    assert count(session, "api_tokens") == agents_before  # refused: nothing written
    # A second enrolment token does not get around it either.
    other = tokens.create(session, scope="enrol", name="another").token
    assert client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(other)).status_code == 409
    # Revoking the node's token (a reimaged node lost its token file) lets it enrol again.
    tokens.revoke(session, token_id=first.json()["id"])
    second = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(enrol_token))
    assert second.status_code == 201 and second.json()["id"] != first.json()["id"]


def test_expired_or_revoked_enrolment_token_is_refused(client, session):
    expired = tokens.create(session, scope="enrol", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    response = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(expired.token))
    assert response.status_code == 401 and "expired" in response.json()["message"]
    revoked = tokens.create(session, scope="enrol")
    tokens.revoke(session, token_id=revoked.record.id)
    response = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(revoked.token))
    assert response.status_code == 401 and "revoked" in response.json()["message"]
    assert count(session, "agent_enrolments") == 0


def test_wrong_node_outside_the_pattern_is_refused(client, session, enrol_token):
    response = client.post(URL, json={"node_name": "login-01"}, headers=bearer(enrol_token))
    assert response.status_code == 403
    assert "does not match" in response.json()["message"] and "gpu-*" in response.json()["message"]
    assert count(session, "agent_enrolments") == 0


@pytest.mark.parametrize("scope", ["agent", "scheduler", "admin"])
def test_other_tokens_cannot_enrol(client, make_token, scope):
    response = client.post(URL, json={"node_name": "gpu-017"}, headers=bearer(make_token(scope)))
    assert response.status_code == 403 and "enrol" in response.json()["message"]


@pytest.mark.parametrize("body", [{}, {"node_name": ""}, {"node_name": "gpu 17"}, {"node_name": "a", "x": 1}])
def test_bad_bodies_are_422_and_enrol_nothing(client, session, enrol_token, body):
    assert client.post(URL, json=body, headers=bearer(enrol_token)).status_code == 422
    assert count(session, "agent_enrolments") == 0


def test_admins_create_enrolment_tokens_with_a_pattern_and_only_those(client, make_token):
    admin = bearer(make_token("admin"))
    created = client.post("/api/v1/tokens", json={"scope": "enrol", "node_pattern": "gpu-[0-4]*"}, headers=admin)
    assert created.status_code == 201 and created.json()["node_pattern"] == "gpu-[0-4]*"
    refused = client.post("/api/v1/tokens", json={"scope": "agent", "node_pattern": "gpu-*"}, headers=admin)
    assert refused.status_code == 422 and "node pattern" in refused.json()["message"]
    bad = client.post("/api/v1/tokens", json={"scope": "enrol", "node_pattern": "gpu-*; rm"}, headers=admin)
    assert bad.status_code == 422
