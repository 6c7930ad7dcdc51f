"""Planned maintenance windows over HTTP: announce, list, cancel (operator scope), the 4xx answers that change
nothing, and the agent's report of its cloud's scheduled events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests import rows
from tests.conftest import bearer, count


@pytest.fixture
def tokens(make_token: Any) -> dict[str, dict[str, str]]:
    return {
        "operator": bearer(make_token("operator", name="alice")),
        "scheduler": bearer(make_token("scheduler", name="slurm")),
        "agent": bearer(make_token("agent", name="a")),
        "bound": bearer(make_token("agent", node="mw-2", name="b")),
    }


def _at(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat()


def _window(**overrides: Any) -> dict[str, Any]:
    return {"starts_at": _at(hours=2), "ends_at": _at(hours=4), "reason": "BIOS update, OPS-2231"} | overrides


def test_announce_list_cancel(client, session, tokens) -> None:
    rows.node(session, "mw-1")
    created = client.post("/api/v1/nodes/mw-1/maintenance", json=_window(), headers=tokens["operator"])
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["node"], body["state"], body["source"], body["author"]) == (
        "mw-1",
        "announced",
        "operator",
        "operator:alice",
    )
    assert body["prepared_at"] is None and body["silence_id"] is None

    listed = client.get("/api/v1/nodes/mw-1/maintenance", headers=tokens["scheduler"]).json()["items"]
    assert [w["id"] for w in listed] == [body["id"]]
    everyone = client.get("/api/v1/maintenance", params={"current": True}, headers=tokens["operator"]).json()
    assert body["id"] in [w["id"] for w in everyone["items"]]

    cancelled = client.delete(f"/api/v1/nodes/mw-1/maintenance/{body['id']}", headers=tokens["operator"])
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["cancelled_by"] == "operator:alice"
    again = client.delete(f"/api/v1/nodes/mw-1/maintenance/{body['id']}", headers=tokens["operator"])
    assert again.status_code == 200 and again.json() == cancelled.json()
    current = client.get("/api/v1/nodes/mw-1/maintenance", params={"current": True}, headers=tokens["operator"])
    assert current.json()["items"] == []


@pytest.mark.parametrize(
    ("window", "status", "says"),
    [
        (_window(starts_at=_at(hours=-3), ends_at=_at(hours=-1)), 422, "ended already"),
        (_window(starts_at=_at(hours=-2), ends_at=_at(hours=1)), 422, "starts_at"),
        (_window(starts_at=_at(hours=3), ends_at=_at(hours=2)), 422, "must be after starts_at"),
        (_window(starts_at="2026-11-30T02:00:00"), 422, "timezone"),
        (_window(reason=""), 422, "reason"),
        ({"starts_at": _at(hours=1), "ends_at": _at(hours=2)}, 422, "reason"),
        (_window(extra=1), 422, "extra"),
    ],
)
def test_bad_windows_are_refused_and_change_nothing(client, session, tokens, window, status, says) -> None:
    rows.node(session, "mw-1")
    before = count(session, "maintenance_windows")
    response = client.post("/api/v1/nodes/mw-1/maintenance", json=window, headers=tokens["operator"])
    assert response.status_code == status, response.text
    assert says in response.text
    assert count(session, "maintenance_windows") == before


def test_unknown_node_overlap_and_scopes(client, session, tokens) -> None:
    missing = client.post("/api/v1/nodes/no-such-node/maintenance", json=_window(), headers=tokens["operator"])
    assert missing.status_code == 404 and "no-such-node" in missing.json()["message"]
    rows.node(session, "mw-1")
    assert client.post("/api/v1/nodes/mw-1/maintenance", json=_window(), headers=tokens["operator"]).status_code == 201
    overlap = _window(starts_at=_at(hours=3), ends_at=_at(hours=5))
    clash = client.post("/api/v1/nodes/mw-1/maintenance", json=overlap, headers=tokens["operator"])
    assert clash.status_code == 409 and "cancel it first" in clash.json()["message"]
    for who in ("scheduler", "agent"):
        refused = client.post("/api/v1/nodes/mw-1/maintenance", json=_window(), headers=tokens[who])
        assert refused.status_code == 403
    assert client.post("/api/v1/nodes/mw-1/maintenance", json=_window()).status_code == 401
    assert client.delete("/api/v1/nodes/mw-1/maintenance/999999", headers=tokens["operator"]).status_code == 404


def _cloud(*events: dict[str, Any], provider: str = "aws") -> dict[str, Any]:
    return {"provider": provider, "events": list(events)}


def _event(event_id: str, **delta: float) -> dict[str, Any]:
    start = datetime.now(UTC) + timedelta(**(delta or {"hours": 2}))
    return {
        "event_id": event_id,
        "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(minutes=20)).isoformat(),
        "description": "system-reboot: scheduled reboot",
    }


def test_an_agent_reports_its_cloud_s_events(client, session, tokens) -> None:
    rows.node(session, "mw-2")
    url = "/api/v1/nodes/mw-2/maintenance/cloud"
    first = client.put(
        url, json=_cloud(_event("instance-event-1"), _event("instance-event-2")), headers=tokens["bound"]
    )
    assert first.status_code == 200, first.text
    windows = first.json()["windows"]
    assert [(w["source"], w["external_id"], w["state"]) for w in windows] == [
        ("cloud:aws", "instance-event-1", "announced"),
        ("cloud:aws", "instance-event-2", "announced"),
    ]
    # Reported again on the next poll: the same windows, not new ones; one withdrawn is cancelled.
    again = client.put(url, json=_cloud(_event("instance-event-1")), headers=tokens["agent"])
    assert again.status_code == 200
    assert [w["id"] for w in again.json()["windows"]] == [windows[0]["id"]]
    assert again.json()["cancelled"] == [windows[1]["id"]]
    assert count(session, "maintenance_windows") == 2
    # Another node's token may not speak for this one; an event ending before it starts is refused.
    rows.node(session, "mw-3")
    foreign = client.put("/api/v1/nodes/mw-3/maintenance/cloud", json=_cloud(_event("e")), headers=tokens["bound"])
    assert foreign.status_code == 403
    bad = _event("instance-event-3") | {"ends_at": _at(hours=1)}
    assert client.put(url, json=_cloud(bad), headers=tokens["agent"]).status_code == 422
    assert client.put(url, json=_cloud(_event("x"), provider="oracle"), headers=tokens["agent"]).status_code == 422
    assert client.put(url, json=_cloud(_event("x")), headers=tokens["operator"]).status_code == 403
    assert count(session, "maintenance_windows") == 2
