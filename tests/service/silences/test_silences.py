"""Silences: the /api/v1/silences endpoints and the matching the diagnosis code asks for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.security import Principal
from service.silences import service as silences
from service.silences.schemas import SilenceIn
from tests.conftest import bearer, count

URL = "/api/v1/silences"
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
ALICE = Principal(token_id=9, scope="operator", node_name=None, name="alice", expires_at=None)


@pytest.fixture
def operator(make_token: Any) -> dict[str, str]:
    return bearer(make_token("operator", name="alice"))


def _at(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat()


def test_create_with_a_duration_defaults_start_and_author(client, operator):
    body = {"node_pattern": "gpu-node-01?", "duration_s": 7200, "comment": "PSU"}
    response = client.post(URL, json=body, headers=operator)
    assert response.status_code == 201, response.text
    body = response.json()
    starts, ends = datetime.fromisoformat(body["starts_at"]), datetime.fromisoformat(body["ends_at"])
    assert abs(starts - datetime.now(UTC)) < timedelta(minutes=1) and ends - starts == timedelta(hours=2)
    assert body["author"] == "alice" and body["comment"] == "PSU" and body["state"] == "active"
    assert body["job_pattern"] is None and body["expired_at"] is None
    assert client.get(f"{URL}/{body['id']}", headers=operator).json() == body


def test_author_is_the_token_id_without_a_name_unless_given(client, make_token):
    token = make_token("admin")
    headers = bearer(token)
    first = client.post(URL, json={"job_pattern": "llm-*", "duration_s": 60}, headers=headers).json()
    assert first["author"].startswith("token #")
    named = client.post(URL, json={"job_pattern": "llm-*", "duration_s": 60, "author": "bob"}, headers=headers)
    assert named.json()["author"] == "bob"


def test_states_filters_and_pages(client, operator):
    ids = {}
    ids["active"] = client.post(URL, json={"node_pattern": "a-*", "duration_s": 600}, headers=operator).json()["id"]
    pending = {"node_pattern": "p-*", "starts_at": _at(hours=1), "ends_at": _at(hours=2)}
    ids["pending"] = client.post(URL, json=pending, headers=operator).json()["id"]
    ids["expired"] = client.post(URL, json={"node_pattern": "e-*", "duration_s": 600}, headers=operator).json()["id"]
    assert client.delete(f"{URL}/{ids['expired']}", headers=operator).status_code == 200
    for state, silence_id in ids.items():
        listed = client.get(URL, params={"state": state}, headers=operator).json()["items"]
        assert [(s["id"], s["state"]) for s in listed] == [(silence_id, state)]
    first = client.get(URL, params={"limit": 2}, headers=operator).json()
    second = client.get(URL, params={"limit": 2, "cursor": first["next_cursor"]}, headers=operator).json()
    assert [s["id"] for s in first["items"] + second["items"]] == sorted(ids.values(), reverse=True)
    assert second["next_cursor"] is None
    assert client.get(URL, params={"state": "muted"}, headers=operator).status_code == 422
    assert client.get(URL, params={"cursor": "nonsense"}, headers=operator).status_code == 422


def test_delete_expires_now_keeps_the_row_and_is_idempotent(client, session, operator):
    before = count(session, "silences")
    created = client.post(URL, json={"job_pattern": "llm-7", "duration_s": 3600}, headers=operator).json()
    ended = client.delete(f"{URL}/{created['id']}", headers=operator)
    assert ended.status_code == 200
    body = ended.json()
    assert body["state"] == "expired" and body["expired_at"] is not None and body["ends_at"] == created["ends_at"]
    again = client.delete(f"{URL}/{created['id']}", headers=operator)
    assert again.status_code == 200 and again.json() == body
    assert count(session, "silences") == before + 1
    assert client.delete(f"{URL}/999999", headers=operator).status_code == 404
    assert client.get(f"{URL}/999999", headers=operator).status_code == 404


def test_a_pending_silence_ended_early_is_expired(client, operator):
    pending = {"node_pattern": "n-1", "starts_at": _at(hours=1), "ends_at": _at(hours=2)}
    created = client.post(URL, json=pending, headers=operator).json()
    assert created["state"] == "pending"
    assert client.delete(f"{URL}/{created['id']}", headers=operator).json()["state"] == "expired"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"duration_s": 60}, "give node_pattern, job_pattern or both"),
        ({"node_pattern": "n-1"}, "exactly one of ends_at and duration_s"),
        ({"node_pattern": "n-1", "duration_s": 60, "ends_at": "2030-01-01T00:00:00Z"}, "exactly one"),
        ({"node_pattern": "n-1", "starts_at": "2030-01-02T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z"}, "after"),
        ({"node_pattern": "n-1", "ends_at": "2001-01-01T00:00:00Z"}, "in the past"),
        ({"node_pattern": "n-1", "ends_at": "9999-12-31T23:59:59-14:00"}, "ten years"),  # year 10000 in UTC
        ({"node_pattern": "n-1", "ends_at": "2099-01-01T00:00:00"}, "body.ends_at: Input should have timezone"),
        ({"node_pattern": "gpu node 1", "duration_s": 60}, "body.node_pattern"),
        ({"node_pattern": "", "duration_s": 60}, "body.node_pattern"),
        ({"job_pattern": " llm-*", "duration_s": 60}, "body.job_pattern"),
        ({"node_pattern": "n-1", "duration_s": 0}, "body.duration_s"),
        ({"node_pattern": "n-1", "duration_s": 60, "matchers": []}, "body.matchers: Extra inputs"),
    ],
)
def test_bad_silences_are_422_and_create_nothing(client, session, operator, body, message):
    before = count(session, "silences")
    response = client.post(URL, json=body, headers=operator)
    assert response.status_code == 422
    assert message in response.json()["message"]
    assert count(session, "silences") == before


def test_schedulers_read_but_do_not_write(client, session, make_token, operator):
    before = count(session, "silences")
    created = client.post(URL, json={"node_pattern": "n-*", "duration_s": 60}, headers=operator).json()
    scheduler = bearer(make_token("scheduler"))
    assert client.get(URL, headers=scheduler).json()["items"][0]["id"] == created["id"]
    assert client.get(f"{URL}/{created['id']}", headers=scheduler).status_code == 200
    assert client.post(URL, json={"node_pattern": "m-*", "duration_s": 60}, headers=scheduler).status_code == 403
    assert client.delete(f"{URL}/{created['id']}", headers=scheduler).status_code == 403
    assert count(session, "silences") == before + 1
    assert client.get(f"{URL}/{created['id']}", headers=scheduler).json()["state"] == "active"


# covering / covered_nodes over the active silences: what diagnosis asks.


def _silence(session: Session, *, start: float = -60, end: float = 3600, **patterns: str) -> int:
    silence_in = SilenceIn(
        starts_at=NOW + timedelta(seconds=start), ends_at=NOW + timedelta(seconds=end), comment="test", **patterns
    )
    return silences.create(session, silence_in=silence_in, principal=ALICE, now=NOW - timedelta(hours=1)).id


def _for(session: Session, job: str | None, *nodes: str) -> int | None:
    found = silences.covering(silences.active_silences(session, now=NOW), job=job, nodes=nodes)
    return found.id if found else None


def test_job_only_silence_matches_the_job_whatever_the_nodes(session):
    sid = _silence(session, job_pattern="llm-pretrain-*")
    assert _for(session, "llm-pretrain-42", "gpu-1") == sid
    assert _for(session, "llm-pretrain-42") == sid
    assert _for(session, "llm-finetune-1", "gpu-1") is None
    assert _for(session, None, "gpu-1") is None


def test_node_only_silence_matches_when_any_node_does(session):
    sid = _silence(session, node_pattern="gpu-node-0[1-4]")
    assert _for(session, "job-1", "gpu-node-09", "gpu-node-03") == sid
    assert _for(session, None, "gpu-node-01") == sid
    assert _for(session, "job-1", "gpu-node-05", "gpu-node-09") is None
    assert _for(session, "job-1") is None
    assert _for(session, "job-1", "GPU-NODE-01") is None  # case-sensitive, like node names


def test_silence_with_both_patterns_needs_both(session):
    sid = _silence(session, job_pattern="llm-*", node_pattern="rack7-*")
    assert _for(session, "llm-1", "rack3-a", "rack7-b") == sid
    assert _for(session, "bert-1", "rack7-b") is None
    assert _for(session, "llm-1", "rack3-a") is None
    assert _for(session, None, "rack7-b") is None


def test_only_active_silences_count(session):
    _silence(session, node_pattern="n-1", start=60, end=3600)  # pending
    _silence(session, node_pattern="n-1", start=-3600, end=0)  # ended exactly now
    ended_early = _silence(session, node_pattern="n-1")
    silences.expire(session, silence_id=ended_early, now=NOW - timedelta(seconds=1))
    assert _for(session, "job", "n-1") is None
    live = _silence(session, node_pattern="n-?")
    assert _for(session, "job", "n-1") == live


def test_the_longest_silence_wins(session):
    _silence(session, node_pattern="n-1", end=600)
    longest = _silence(session, job_pattern="job", end=7200)
    _silence(session, node_pattern="n-*", end=3600)
    assert _for(session, "job", "n-1") == longest


def _covered(session: Session, nodes: list[str], job: str) -> dict[str, int]:
    return silences.covered_nodes(silences.active_silences(session, now=NOW), nodes=nodes, job=job)


def test_covered_nodes_maps_each_node_to_its_silence(session):
    rack = _silence(session, node_pattern="rack7-*")
    only_in_llm = _silence(session, node_pattern="rack3-a", job_pattern="llm-*")
    nodes = ["rack7-a", "rack7-b", "rack3-a", "rack3-b"]
    assert _covered(session, nodes, "llm-1") == {
        "rack7-a": rack,
        "rack7-b": rack,
        "rack3-a": only_in_llm,
    }
    assert _covered(session, nodes, "bert-1") == {"rack7-a": rack, "rack7-b": rack}
    whole_job = _silence(session, job_pattern="bert-1", end=7200)
    assert _covered(session, nodes, "bert-1") == dict.fromkeys(nodes, whole_job)


def test_matching_many_nodes_against_the_active_silences_is_one_query(session):
    for i in range(20):
        _silence(session, node_pattern=f"rack{i}-*")
    statements: list[str] = []
    connection = session.connection()
    listener = lambda *args: statements.append(args[2])  # noqa: E731
    event.listen(connection, "before_cursor_execute", listener)
    try:
        active = silences.active_silences(session, now=NOW)
        covered = silences.covered_nodes(active, nodes=[f"rack{i % 40}-n{i}" for i in range(2000)], job="j")
        found = silences.covering(active, job="j", nodes=[f"rack{i}-n" for i in range(40, 2000)])
    finally:
        event.remove(connection, "before_cursor_execute", listener)
    assert len(covered) == 1000 and found is None
    assert len(statements) == 1
