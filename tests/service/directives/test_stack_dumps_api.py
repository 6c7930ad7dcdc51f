"""Stack-dump requests: created by an operator, delivered in ingest answers, answered with dumps."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from tests.conftest import bearer, count
from tests.factories import batch

THREADS = [
    {
        "pid": 4000,
        "thread_id": 1,
        "thread_name": "MainThread",
        "active": False,
        "owns_gil": False,
        "frames": [
            {"name": "wait", "filename": "/t/distributed_c10d.py", "short_filename": "distributed_c10d.py", "line": 9},
            {"name": "train_step", "filename": "/t/train.py", "short_filename": "train.py", "line": 42},
        ],
    }
]


def _fresh(client) -> None:
    client.app.state.directives.max_age = 0.0  # the per-process cache would hide a new request for a second


def test_request_is_delivered_to_the_jobs_agents_and_answered(client, make_token, session):
    _fresh(client)
    operator, agent = bearer(make_token("operator", name="alice")), bearer(make_token("agent"))
    assert client.post("/api/v1/ingest", json=batch("n1", job_id="job-1"), headers=agent).status_code == 200

    created = client.post("/api/v1/jobs/job-1/stack-dumps", json={"reason": "hung?"}, headers=operator)
    assert created.status_code == 201, created.text
    directive = created.json()
    assert directive["kind"] == "dump_stacks" and directive["requested_by"] == "alice"

    # An agent of that job gets it (named by the batch's job, its heartbeat or its processes) ...
    answer = client.post("/api/v1/ingest", json=batch("n1", job_id="job-1"), headers=agent).json()
    assert answer["directives"] == [{"id": directive["id"], "kind": "dump_stacks", "job_id": "job-1"}]
    hb = batch("n2", job_id=None, processes=[])
    hb["heartbeat"]["jobs"] = ["job-1"]
    assert [d["id"] for d in client.post("/api/v1/ingest", json=hb, headers=agent).json()["directives"]] == [
        directive["id"]
    ]
    # ... an agent of another job does not.
    assert client.post("/api/v1/ingest", json=batch("n3", job_id="other"), headers=agent).json()["directives"] == []

    dump = batch("n1", job_id="job-1", metrics=[], logs=[], processes=[])
    dump["stacks"] = [
        {"ts": dump["sent_at"], "pid": 4000, "rank": 0, "directive_id": directive["id"], "threads": THREADS}
    ]
    dump["stacks"].append(
        {"ts": dump["sent_at"], "pid": 4001, "rank": 1, "directive_id": directive["id"], "error": "x"}
    )
    assert client.post("/api/v1/ingest", json=dump, headers=agent).json()["stored"]["stacks"] == 2

    got = client.get(f"/api/v1/jobs/job-1/stack-dumps/{directive['id']}", headers=operator).json()
    assert got["nodes_reporting"] == 1
    assert [(d["rank"], d["threads"], d["error"]) for d in got["dumps"]] == [(0, 1, None), (1, 0, "x")]
    assert got["dumps"][0]["frames"] == ["wait (distributed_c10d.py:9)", "train_step (train.py:42)"]


def test_expired_requests_are_no_longer_delivered(client, make_token, session):
    _fresh(client)
    operator, agent = bearer(make_token("operator")), bearer(make_token("agent"))
    client.post("/api/v1/ingest", json=batch("n1", job_id="job-1"), headers=agent)
    client.post("/api/v1/jobs/job-1/stack-dumps", json={"ttl_s": 10}, headers=operator)
    session.execute(text("UPDATE directives SET expires_at = now() - interval '1 s'"))
    assert client.post("/api/v1/ingest", json=batch("n1", job_id="job-1"), headers=agent).json()["directives"] == []


def test_bad_requests_change_nothing(client, make_token, session):
    operator, scheduler = bearer(make_token("operator")), bearer(make_token("scheduler"))
    assert client.post("/api/v1/jobs/nope/stack-dumps", headers=operator).status_code == 404
    client.post("/api/v1/ingest", json=batch("n1", job_id="job-1"), headers=bearer(make_token("agent")))
    assert client.post("/api/v1/jobs/job-1/stack-dumps", json={"ttl_s": 1}, headers=operator).status_code == 422
    assert client.post("/api/v1/jobs/job-1/stack-dumps", json={"x": 1}, headers=operator).status_code == 422
    assert client.post("/api/v1/jobs/job-1/stack-dumps", headers=scheduler).status_code == 403
    assert count(session, "directives") == 0
    assert client.get(f"/api/v1/jobs/job-1/stack-dumps/{uuid.uuid4()}", headers=scheduler).status_code == 404
    assert client.post("/api/v1/jobs/job-1/stack-dumps", headers=operator).status_code == 201  # no body: defaults
