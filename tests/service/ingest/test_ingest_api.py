"""POST /api/v1/ingest: storage, idempotency, and every kind of bad input changing nothing."""

from __future__ import annotations

import gzip
import json
import uuid
from datetime import UTC, datetime

import orjson
import pytest
from sqlalchemy import text

from tests.conftest import bearer, count
from tests.factories import batch

SIGNAL_TABLES = ("agent_batches", "metric_samples", "log_events", "process_snapshots", "stack_dumps", "nodes")


def _nothing_written(session) -> None:
    assert {t: count(session, t) for t in SIGNAL_TABLES} == dict.fromkeys(SIGNAL_TABLES, 0)


@pytest.fixture
def agent(make_token) -> dict[str, str]:
    return bearer(make_token("agent"))


def test_batch_is_stored_with_node_gpus_job_and_ranks(client, session, agent):
    payload = batch(gpus=4)
    payload["stacks"] = [
        {"ts": payload["sent_at"], "pid": 4000, "rank": 0, "job_id": "job-1", "threads": [{"frames": []}]}
    ]
    response = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "accepted"
    assert body["stored"] == {"metrics": 4, "node_metrics": 0, "logs": 1, "stacks": 1, "processes": 4}
    assert body["directives"] == []
    assert count(session, "metric_samples") == 4
    assert count(session, "log_events") == 1
    assert count(session, "stack_dumps") == 1
    assert count(session, "process_snapshots") == 4
    node = session.execute(text("SELECT id, last_seen_at, agent_version FROM nodes WHERE name='gpu-node-001'")).one()
    assert node.last_seen_at is not None and node.agent_version == "0.1.0"
    gpus = session.execute(text("SELECT index, uuid FROM gpus WHERE node_id=:n ORDER BY index"), {"n": node.id}).all()
    assert [(g.index, g.uuid) for g in gpus] == [(i, f"GPU-{i:08x}") for i in range(4)]
    # The job was unknown: it is created from what the agent reports, with its world size.
    job = session.execute(text("SELECT id, world_size, source FROM jobs WHERE external_id='job-1'")).one()
    assert (job.world_size, job.source) == (4, "agent")
    ranks = session.execute(text("SELECT rank, node_id, pid FROM ranks WHERE job_id=:j ORDER BY rank"), {"j": job.id})
    assert [tuple(r) for r in ranks] == [(i, node.id, 4000 + i) for i in range(4)]
    sample = session.execute(
        text("SELECT gpu_util, power_usage, total_energy, job_id, extra FROM metric_samples WHERE gpu = 0")
    ).one()
    assert sample.gpu_util == 97 and sample.power_usage == pytest.approx(650.5)
    assert sample.total_energy == 123456789012  # float8 for counters: no precision lost
    assert sample.job_id == job.id and sample.extra is None
    event = session.execute(text("SELECT kind, severity, fields, job_id FROM log_events")).one()
    assert (event.kind, event.severity, event.fields["xid"], event.job_id) == ("xid", "critical", 79, job.id)


def test_replayed_batch_id_is_stored_once(client, session, agent):
    payload = batch()
    first = client.post("/api/v1/ingest", json=payload, headers=agent)
    second = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert first.json()["status"] == "accepted"
    assert second.status_code == 200 and second.json()["status"] == "duplicate"
    assert count(session, "agent_batches") == 1
    assert count(session, "metric_samples") == 2
    assert count(session, "log_events") == 1


def test_blank_sentinels_are_missing_and_unknown_fields_kept(client, session, agent):
    payload = batch(gpus=1)
    payload["metrics"][0]["fields"] = {
        "DCGM_FI_DEV_MEMORY_TEMP": 9223372036854775794,
        "DCGM_FI_DEV_GPU_TEMP": 61,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
    }
    assert client.post("/api/v1/ingest", json=payload, headers=agent).status_code == 200
    row = session.execute(text("SELECT memory_temp, gpu_temp, extra FROM metric_samples")).one()
    assert row.memory_temp is None and row.gpu_temp == 61
    assert row.extra == {"DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0}


def test_gzip_body_is_accepted(client, session, agent):
    body = gzip.compress(orjson.dumps(batch()))
    headers = {**agent, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    response = client.post("/api/v1/ingest", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert count(session, "metric_samples") == 2


def test_malformed_json_is_422_and_writes_nothing(client, session, agent):
    response = client.post("/api/v1/ingest", content=b'{"batch_id": ', headers=agent)
    assert response.status_code == 422
    assert response.json()["error"] == "invalid"
    assert "json" in response.json()["message"].lower()
    _nothing_written(session)


def test_schema_violation_names_the_field(client, session, agent):
    payload = batch()
    payload["metrics"][1]["gpu"] = -1
    del payload["logs"][0]["kind"]
    response = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert response.status_code == 422
    fields = {d["field"] for d in response.json()["details"]}
    assert fields == {"body.metrics.1.gpu", "body.logs.0.kind"}
    _nothing_written(session)


def test_naive_timestamps_are_rejected(client, session, agent):
    payload = batch()
    payload["sent_at"] = "2026-11-22T10:00:00"
    response = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "body.sent_at"
    _nothing_written(session)


def test_body_over_limit_is_413(client, app, session, agent):
    limit = app.state.settings.ingest_max_body_bytes
    payload = batch()
    payload["logs"][0]["line"] = "x" * 60_000
    payload["logs"] = payload["logs"] * (limit // 60_000 + 2)
    response = client.post("/api/v1/ingest", content=json.dumps(payload), headers=agent)
    assert response.status_code == 413
    _nothing_written(session)


def test_gzip_bomb_is_413(client, app, session, agent):
    limit = app.state.settings.ingest_max_body_bytes
    bomb = gzip.compress(b"[" + b" " * (limit + 10) + b"]")
    assert len(bomb) < limit
    headers = {**agent, "Content-Encoding": "gzip"}
    response = client.post("/api/v1/ingest", content=bomb, headers=headers)
    assert response.status_code == 413
    _nothing_written(session)


def test_value_the_database_refuses_is_422_and_writes_nothing(client, session, agent):
    payload = batch()
    payload["logs"][0]["line"] = "bad \x00 byte"  # PostgreSQL text cannot hold NUL
    response = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert response.status_code == 422, response.text
    _nothing_written(session)


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "missing bearer token"),
        ({"Authorization": "Basic abc"}, 401, "missing bearer token"),
        ({"Authorization": "Bearer fl_not-a-real-token"}, 401, "invalid token"),
    ],
)
def test_missing_or_wrong_token_is_401(client, session, headers, status, message):
    response = client.post("/api/v1/ingest", json=batch(), headers=headers)
    assert response.status_code == status
    assert message in response.json()["message"]
    assert response.headers["www-authenticate"] == "Bearer"
    _nothing_written(session)


def test_non_agent_token_is_403(client, session, make_token):
    response = client.post("/api/v1/ingest", json=batch(), headers=bearer(make_token("scheduler")))
    assert response.status_code == 403
    assert "agent" in response.json()["message"]
    _nothing_written(session)


def test_node_bound_token_cannot_write_another_node(client, session, make_token):
    headers = bearer(make_token("agent", node="node-a"))
    assert client.post("/api/v1/ingest", json=batch("node-b"), headers=headers).status_code == 403
    _nothing_written(session)
    assert client.post("/api/v1/ingest", json=batch("node-a"), headers=headers).status_code == 200


def test_revoked_and_expired_tokens_are_401(client, session, app):
    from datetime import timedelta

    from service.tokens import service as tokens

    revoked = tokens.create(session, scope="agent")
    tokens.revoke(session, token_id=revoked.record.id)
    expired = tokens.create(session, scope="agent", ttl=timedelta(seconds=-1))
    assert client.post("/api/v1/ingest", json=batch(), headers=bearer(revoked.token)).json()["message"] == (
        "token revoked"
    )
    assert client.post("/api/v1/ingest", json=batch(), headers=bearer(expired.token)).json()["message"] == (
        "token expired"
    )
    _nothing_written(session)


def test_items_without_a_job_belong_to_the_nodes_current_job(client, session, agent):
    assert client.post("/api/v1/ingest", json=batch(job_id="job-7"), headers=agent).status_code == 200
    later = batch(job_id=None)  # no processes and no job named: a kernel-log-only batch
    assert client.post("/api/v1/ingest", json=later, headers=agent).status_code == 200
    job_ids = session.execute(text("SELECT DISTINCT job_id FROM log_events")).scalars().all()
    expected = session.execute(text("SELECT id FROM jobs WHERE external_id='job-7'")).scalar_one()
    assert job_ids == [expected]


def test_openapi_documents_the_ingest_body(client):
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/IngestBatch"}
    batch_schema = schema["components"]["schemas"]["IngestBatch"]
    assert {"batch_id", "node", "sent_at", "metrics", "logs", "stacks", "processes", "heartbeat"} <= set(
        batch_schema["properties"]
    )
    assert "MetricSample" in schema["components"]["schemas"]


def test_unique_batch_ids_in_one_request_each(client, session, agent):
    ids = set()
    for _ in range(3):
        payload = batch()
        ids.add(payload["batch_id"])
        assert client.post("/api/v1/ingest", json=payload, headers=agent).json()["status"] == "accepted"
    stored = {str(b) for b in session.execute(text("SELECT batch_id FROM agent_batches")).scalars()}
    assert stored == ids
    assert all(uuid.UUID(i) for i in ids)


def test_restarted_ranks_update_placement_despite_the_upsert_cache(client, session, agent):
    assert client.post("/api/v1/ingest", json=batch("node-a"), headers=agent).status_code == 200
    assert client.post("/api/v1/ingest", json=batch("node-a"), headers=agent).status_code == 200
    moved = batch("node-b")
    for proc in moved["processes"]:
        proc["pid"] += 1000  # torchrun restarted the workers on another machine
    assert client.post("/api/v1/ingest", json=moved, headers=agent).status_code == 200
    rows = session.execute(
        text("SELECT r.rank, n.name, r.pid FROM ranks r JOIN nodes n ON n.id = r.node_id ORDER BY 1")
    )
    assert [tuple(r) for r in rows] == [(0, "node-b", 5000), (1, "node-b", 5001)]


def test_the_columns_a_jobs_agents_report_are_recorded_for_its_window_rollup(client, session, agent):
    payload = batch(gpus=2)
    payload["metrics"][1]["fields"]["DCGM_FI_DEV_GPU_TEMP"] = 61  # on one GPU only: still a reported column
    payload["metrics"][0]["fields"]["SOMETHING_ELSE"] = 1  # kept in `extra`, not a column
    payload["node_metrics"] = [
        {"ts": payload["sent_at"], "subject": "ib:mlx5_0/1", "fields": {"port_state": 4, "link_downed": 2}}
    ]
    assert client.post("/api/v1/ingest", json=payload, headers=agent).status_code == 200
    job = session.execute(text("SELECT id FROM jobs WHERE external_id='job-1'")).scalar_one()
    rows = session.execute(text("SELECT source, name FROM job_columns WHERE job_id=:j ORDER BY 1, 2"), {"j": job})
    assert [tuple(r) for r in rows] == [
        ("gpu", "gpu_temp"),
        ("gpu", "gpu_util"),
        ("gpu", "power_usage"),
        ("gpu", "sm_clock"),
        ("gpu", "total_energy"),
        ("node", "link_downed"),
        ("node", "port_state"),
    ]
    # A second batch with the same fields writes nothing new (and a new field is added).
    again = batch(gpus=1)
    again["metrics"][0]["fields"]["DCGM_FI_DEV_FB_USED"] = 1000
    assert client.post("/api/v1/ingest", json=again, headers=agent).status_code == 200
    assert count(session, "job_columns") == 8


def test_a_node_out_of_service_keeps_no_job_whatever_its_dying_processes_say(client, session, agent):
    """The demo's evicted node reported its job's last processes, kept the job through its repair, and its dead
    GPU's counters accused it when it came back."""
    name = f"gpu-node-{uuid.uuid4().hex[:6]}"
    assert client.post("/api/v1/ingest", json=batch(name, job_id="job-ooo"), headers=agent).status_code == 200
    job_of = "SELECT current_job_id, state FROM nodes WHERE name = :n"
    assert session.execute(text(job_of), {"n": name}).one().current_job_id is not None
    # Evicted after it reported those processes: the same pids afterwards are its dying ranks, not new work.
    evict = "UPDATE nodes SET state = 'evicted', current_job_id = NULL, state_changed_at = :at WHERE name = :n"
    session.execute(text(evict), {"n": name, "at": datetime.now(UTC)})
    session.flush()
    assert client.post("/api/v1/ingest", json=batch(name, job_id="job-ooo"), headers=agent).status_code == 200
    assert session.execute(text(job_of), {"n": name}).one() == (None, "evicted")
