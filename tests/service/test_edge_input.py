"""Input PostgreSQL cannot hold gets a 422 in the API's error shape, never a 500, and changes nothing.

The first requests are the ones a schemathesis run over the OpenAPI document found answering 500.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import bearer, count

TOO_BIG = "99999999999999999999999"  # past PostgreSQL's bigint


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/decisions?after=285241406885938531577072752131047424"),
        ("GET", f"/api/v1/incidents/{TOO_BIG}"),
        ("POST", "/api/v1/deliveries/49608969199518100750336/retry"),
        ("GET", f"/api/v1/deliveries?channel={TOO_BIG}"),
        ("GET", f"/api/v1/decisions/{TOO_BIG}"),
        ("GET", "/api/v1/incidents/0"),
        ("GET", "/api/v1/nodes/%00"),
        ("GET", "/api/v1/nodes/%FF%FE"),
        ("GET", "/api/v1/incidents?root_cause=a%00b"),
    ],
)
def test_out_of_range_ids_and_unstorable_text_are_422(client: Any, make_token: Any, method: str, path: str) -> None:
    response = client.request(method, path, headers=bearer(make_token("admin")))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid" and body["message"]


def test_a_cursor_past_bigint_is_422(client: Any, make_token: Any) -> None:
    import base64

    cursor = base64.urlsafe_b64encode(f"id:{TOO_BIG}".encode()).decode().rstrip("=")
    response = client.get(f"/api/v1/incidents?cursor={cursor}", headers=bearer(make_token("admin")))
    assert response.status_code == 422 and "cursor" in response.json()["message"]


def test_a_nul_in_a_body_is_422_and_stores_nothing(client: Any, make_token: Any, session: Any) -> None:
    before = count(session, "silences")
    response = client.post(
        "/api/v1/silences",
        json={"node_pattern": "gpu-node-1", "duration_s": 600, "comment": "bad\u0000comment"},
        headers=bearer(make_token("operator", name="oncall")),
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid"
    assert count(session, "silences") == before


def test_a_nul_in_a_header_is_422(client: Any, make_token: Any) -> None:
    response = client.get("/api/v1/incidents", headers={**bearer(make_token("admin")), "X-Note": "a\x00b"})
    assert response.status_code == 422 and "X-Note" in response.json()["message"].title()


def test_an_agent_batch_with_a_nul_in_a_line_is_422_and_stores_nothing(
    client: Any, make_token: Any, session: Any
) -> None:
    import uuid
    from datetime import UTC, datetime

    now = datetime.now(UTC).isoformat()
    batch = {
        "batch_id": str(uuid.uuid4()),
        "node": "gpu-node-1",
        "sent_at": now,
        "logs": [{"ts": now, "source": "kmsg", "kind": "xid", "line": "NVRM: Xid\u0000 79"}],
    }
    before = count(session, "log_events"), count(session, "agent_batches")
    response = client.post("/api/v1/ingest", json=batch, headers=bearer(make_token("agent")))
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid"
    assert (count(session, "log_events"), count(session, "agent_batches")) == before


def _agent_batch(**overrides: Any) -> dict[str, Any]:
    import uuid
    from datetime import UTC, datetime

    now = datetime.now(UTC).isoformat()
    batch: dict[str, Any] = {"batch_id": str(uuid.uuid4()), "node": "gpu-node-1", "sent_at": now, "job_id": "j1"}
    batch["logs"] = [{"ts": now, "source": "kmsg", "kind": "xid", "line": "NVRM: Xid 79"}]
    batch["processes"] = [{"ts": now, "pid": 4242, "rank": 0}]
    for path, value in overrides.items():
        section, field = path.split(".")
        batch[section][0][field] = value
    return batch


@pytest.mark.parametrize(
    "overrides",
    [
        {"logs.ts": "9999-12-31T23:59:59-14:00"},  # year 10000 in UTC: would break every query over the job
        {"logs.ts": "0001-01-01T00:00:00+14:00"},  # 1 BC in UTC
        {"logs.ts": "2020-01-01T00:00:00Z"},  # older than any spool replay
        {"processes.ts": "2999-01-01T00:00:00Z"},
        {"processes.pid": 2**31},  # an int4 column: wrapped around, it would be stored negative
        {"processes.rank": 2**31},
        {"processes.rss_bytes": 2**63},
    ],
)
def test_implausible_times_and_out_of_range_numbers_are_422_and_store_nothing(
    client: Any, make_token: Any, session: Any, overrides: dict[str, Any]
) -> None:
    before = count(session, "log_events"), count(session, "process_snapshots"), count(session, "agent_batches")
    response = client.post("/api/v1/ingest", json=_agent_batch(**overrides), headers=bearer(make_token("agent")))
    assert response.status_code == 422, response.text
    field = next(iter(overrides)).replace(".", ".0.")
    assert any(field in d["field"] for d in response.json()["details"]), response.json()
    after = count(session, "log_events"), count(session, "process_snapshots"), count(session, "agent_batches")
    assert after == before


def test_a_plausible_batch_is_stored(client: Any, make_token: Any) -> None:
    """The control for the cases above: the same batch with sane values is accepted."""
    response = client.post("/api/v1/ingest", json=_agent_batch(), headers=bearer(make_token("agent")))
    assert response.status_code == 200, response.text


def test_an_alert_from_the_year_10000_is_422(client: Any, make_token: Any) -> None:
    alert = {"status": "firing", "labels": {"alertname": "GpuXid"}, "startsAt": "9999-12-31T23:59:59-14:00"}
    payload = {"version": "4", "status": "firing", "alerts": [{**alert, "fingerprint": "f1"}]}
    response = client.post("/api/v1/alertmanager", json=payload, headers=bearer(make_token("agent")))
    assert response.status_code == 422 and "startsAt" in response.text


@pytest.mark.parametrize(
    ("scope", "path", "body"),
    [
        ("operator", "/api/v1/silences", {"node_pattern": "n1", "ends_at": "9999-12-31T23:59:59-14:00"}),
        ("admin", "/api/v1/tokens", {"scope": "scheduler", "expires_at": "9999-12-31T23:59:59-14:00"}),
        ("admin", "/api/v1/tokens", {"scope": "scheduler", "name": "a\u0000b"}),
        ("scheduler", "/api/v1/jobs", {"job_id": "j\u0000", "world_size": 8}),
        ("operator", "/api/v1/nodes/gpu-node-1/cordon", {"reason": "bad\u0000psu"}),
        (
            "agent",
            "/api/v1/alertmanager",
            {
                "version": "4",
                "alerts": [
                    {"status": "firing", "labels": {"alertname": "x\u0000", "Hostname": "gpu-node-1"}}
                    | {"startsAt": "2026-11-24T00:00:00Z", "fingerprint": "f"}
                ],
            },
        ),
    ],
)
def test_far_future_times_and_nul_characters_in_bodies_are_422(
    client: Any, make_token: Any, scope: str, path: str, body: dict[str, Any]
) -> None:
    from tests.factories import batch

    known = client.post("/api/v1/ingest", json=batch("gpu-node-1", logs=[]), headers=bearer(make_token("agent")))
    assert known.status_code == 200  # the node the cordon and the alert name exists
    response = client.post(path, json=body, headers=bearer(make_token(scope, name="edge")))
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid"


def test_a_large_body_is_refused_before_it_is_held(client: Any, make_token: Any) -> None:
    """A route's size limit applies as the body is read: without a token it is not read at all (401)."""
    big = b'{"comment": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    json_type = {"Content-Type": "application/json"}
    assert client.post("/api/v1/silences", content=big, headers=json_type).status_code == 401
    response = client.post("/api/v1/silences", content=big, headers={**json_type, **bearer(make_token("operator"))})
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "payload_too_large"
    form = client.post("/silences", content=big, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 413
    # Alertmanager notifications may be as large as agents' batches.
    alerts = b'{"version": "4", "alerts": [], "receiver": "' + b"x" * (2 << 20) + b'"}'
    answer = client.post("/api/v1/alertmanager", content=alerts, headers={**json_type, **bearer(make_token("agent"))})
    assert answer.status_code != 413, answer.text


def test_a_body_without_a_valid_token_is_never_read(client: Any) -> None:
    """Authentication comes first: the answer is the 401, not an opinion about the body."""
    response = client.post("/api/v1/silences", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 401 and response.json()["error"] == "unauthenticated"
    forged = client.post("/api/v1/jobs", content=b"{not json", headers={"Authorization": "Bearer fl_nope"})
    assert forged.status_code == 401
