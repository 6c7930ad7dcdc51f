"""POST/GET /api/v1/jobs: registration, validation, and jobs first seen in agent data."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.config import get_settings
from service.diagnosis import service as diagnosis
from tests.conftest import bearer, count
from tests.factories import batch


@pytest.fixture
def scheduler(make_token) -> dict[str, str]:
    return bearer(make_token("scheduler"))


JOB = {
    "job_id": "llm-42",
    "world_size": 8,
    "parallelism": {"tp": 2, "pp": 2, "dp": 2, "order": "tp-dp-pp"},
    "hang_timeout_s": 120,
    "ranks": [{"rank": r, "node": f"node-{r // 4}", "local_rank": r % 4} for r in range(8)],
}


def test_register_and_read_back(client, scheduler):
    response = client.post("/api/v1/jobs", json=JOB, headers=scheduler)
    assert response.status_code == 200, response.text
    job = client.get("/api/v1/jobs/llm-42", headers=scheduler).json()
    assert job["world_size"] == 8
    assert job["parallelism"] == {"tp": 2, "pp": 2, "dp": 2, "order": "tp-dp-pp"}
    assert job["hang_timeout_s"] == 120 and job["source"] == "registered"
    assert job["nodes"] == ["node-0", "node-1"]
    assert [(r["rank"], r["node"], r["local_rank"], r["gpu"]) for r in job["ranks"]] == [
        (r, f"node-{r // 4}", r % 4, r % 4) for r in range(8)
    ]


def test_a_full_diagnosis_pass_shows_as_the_jobs_diagnosed_at(client, session, scheduler):
    """The replay's wait reads it (agents/replay/client.py)."""
    client.post("/api/v1/jobs", json=JOB, headers=scheduler)
    assert client.get("/api/v1/jobs/llm-42", headers=scheduler).json()["diagnosed_at"] is None
    at = datetime.now(UTC).replace(microsecond=0)
    assert not diagnosis.diagnose_job(session, job_id="llm-42", settings=get_settings(), now=at).skipped
    shown = client.get("/api/v1/jobs/llm-42", headers=scheduler).json()["diagnosed_at"]
    assert datetime.fromisoformat(shown.replace("Z", "+00:00")) == at


def test_registering_again_updates(client, scheduler):
    client.post("/api/v1/jobs", json=JOB, headers=scheduler)
    moved = {**JOB, "hang_timeout_s": 60, "ranks": [{"rank": 0, "node": "spare-node"}]}
    job = client.post("/api/v1/jobs", json=moved, headers=scheduler).json()
    assert job["hang_timeout_s"] == 60
    assert job["ranks"][0]["node"] == "spare-node"
    assert len(job["ranks"]) == 8


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"parallelism": {"tp": 2, "pp": 2, "dp": 4}}, "body", "must equal world_size 8"),
        ({"parallelism": {"tp": 2, "pp": 2, "dp": 2, "order": "tp-pp"}}, "body.parallelism", "order must name"),
        ({"world_size": 0, "parallelism": None, "ranks": None}, "body.world_size", "greater than or equal to 1"),
        ({"ranks": [{"rank": 9, "node": "n"}]}, "body", "outside world_size"),
        ({"ranks": [{"rank": 1, "node": "n"}, {"rank": 1, "node": "m"}]}, "body", "placed twice"),
        ({"hang_timeout_s": "soon"}, "body.hang_timeout_s", "valid integer"),
        ({"surprise": 1}, "body.surprise", "not permitted"),
    ],
)
def test_invalid_job_is_422_with_the_reason(client, session, scheduler, change, field, words):
    response = client.post("/api/v1/jobs", json={**JOB, **change}, headers=scheduler)
    assert response.status_code == 422
    detail = response.json()["details"][0]
    assert detail["field"] == field
    assert words in detail["message"]
    assert count(session, "jobs") == 0 and count(session, "nodes") == 0


def test_unknown_job_is_404(client, scheduler):
    response = client.get("/api/v1/jobs/nope", headers=scheduler)
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "message": "no job 'nope'"}


def test_job_seen_by_agents_first_then_registered(client, make_token, scheduler):
    agent = bearer(make_token("agent"))
    assert client.post("/api/v1/ingest", json=batch(job_id="llm-42", gpus=2), headers=agent).status_code == 200
    seen = client.get("/api/v1/jobs/llm-42", headers=scheduler).json()
    assert (seen["source"], seen["world_size"], seen["parallelism"]) == ("agent", 2, None)
    assert [r["node"] for r in seen["ranks"]] == ["gpu-node-001", "gpu-node-001"]
    registered = client.post("/api/v1/jobs", json={**JOB, "ranks": None}, headers=scheduler).json()
    assert registered["source"] == "registered" and registered["world_size"] == 8
    # The agents' placement is kept where registration says nothing.
    assert registered["ranks"][0]["pid"] == 4000


@pytest.mark.parametrize("scope", ["scheduler", "operator", "admin"])
def test_people_and_schedulers_may_register(client, make_token, scope):
    assert client.post("/api/v1/jobs", json=JOB, headers=bearer(make_token(scope))).status_code == 200


def test_agent_token_cannot_register_jobs(client, make_token):
    response = client.post("/api/v1/jobs", json=JOB, headers=bearer(make_token("agent")))
    assert response.status_code == 403


def test_health_reports_database_and_broker(client):
    body = client.get("/healthz").json()
    assert body == {"status": "ok", "database": "ok", "broker": "ok"}


def test_an_agent_cannot_move_a_registered_rank_onto_its_own_node(client, session, make_token) -> None:
    """The scheduler's map says where ranks run; another node's agent naming that rank changes nothing."""
    from tests.factories import batch

    job = "registered-map"
    placement = {
        "job_id": job,
        "world_size": 2,
        "ranks": [{"rank": 0, "node": "node-b"}, {"rank": 1, "node": "node-b"}],
    }
    assert client.post("/api/v1/jobs", json=placement, headers=bearer(make_token("scheduler"))).status_code == 200
    claim = batch("node-a", job_id=job, logs=[], gpus=1)  # process of rank 0 "on node-a"
    assert (
        client.post("/api/v1/ingest", json=claim, headers=bearer(make_token("agent", node="node-a"))).status_code == 200
    )
    ranks = client.get(f"/api/v1/jobs/{job}", headers=bearer(make_token("scheduler"))).json()["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks] == [(0, "node-b"), (1, "node-b")]
    own = batch("node-b", job_id=job, logs=[], gpus=1)  # the rank's own node fills in its pid
    assert (
        client.post("/api/v1/ingest", json=own, headers=bearer(make_token("agent", node="node-b"))).status_code == 200
    )
    ranks = client.get(f"/api/v1/jobs/{job}", headers=bearer(make_token("scheduler"))).json()["ranks"]
    assert ranks[0]["node"] == "node-b" and ranks[0]["pid"] == 4000


def test_a_job_is_ended_and_registering_it_again_reopens_it(client, scheduler):
    client.post("/api/v1/jobs", json=JOB, headers=scheduler)
    ended = client.post("/api/v1/jobs/llm-42/end", json={"state": "failed"}, headers=scheduler)
    assert ended.status_code == 200 and ended.json()["state"] == "failed"
    assert client.get("/api/v1/jobs/llm-42", headers=scheduler).json()["state"] == "failed"
    assert client.post("/api/v1/jobs", json=JOB, headers=scheduler).json()["state"] == "running"


@pytest.mark.parametrize("body", [{}, {"state": "running"}, {"state": "finished", "x": 1}])
def test_ending_with_a_bad_state_is_422_and_changes_nothing(client, scheduler, body):
    client.post("/api/v1/jobs", json=JOB, headers=scheduler)
    assert client.post("/api/v1/jobs/llm-42/end", json=body, headers=scheduler).status_code == 422
    assert client.get("/api/v1/jobs/llm-42", headers=scheduler).json()["state"] == "running"


def test_ending_an_unknown_job_is_404(client, scheduler):
    assert client.post("/api/v1/jobs/nope/end", json={"state": "finished"}, headers=scheduler).status_code == 404
