"""GET/POST /api/v1/shared-incidents: list, filter, detail with its cordons, resolve by hand; bad input is a 4xx."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Node
from service.shared_causes import service as shared
from tests.conftest import bearer

NOW = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def _incident(session: Session, kind: str, component: str, names: list[str]) -> int:
    nodes = [Node(name=n) for n in names]
    session.add_all(nodes)
    session.flush()
    incident = shared.open_or_update(
        session,
        component_kind=kind,
        component=component,
        node_ids=[n.id for n in nodes],
        summary=f"findings behind {component}",
        evidence={"categories": ["network"]},
        now=NOW,
    )
    # Six nodes all cordoned: past the fleet breaker's floor of 3 (its hold is tested in test_shared_safety.py).
    shared.decide_for_component(session, incident=incident, now=NOW, settings=Settings(breaker_enabled=False))
    return incident.id


def test_list_filter_detail_and_resolve(session: Session, client: Any, make_token: Any) -> None:
    switch = _incident(session, "switch", "leaf-7", ["a-1", "a-2", "a-3"])
    driver = _incident(session, "driver", "560.28.03", ["b-1", "b-2", "b-3"])
    reader = bearer(make_token("scheduler"))
    page = client.get("/api/v1/shared-incidents", headers=reader).json()
    assert [i["id"] for i in page["items"]] == [driver, switch]
    assert page["items"][1]["members"][0]["node"] == "a-1"
    only = client.get("/api/v1/shared-incidents?component_kind=switch", headers=reader).json()["items"]
    assert [i["component"] for i in only] == ["leaf-7"]
    by_node = client.get("/api/v1/shared-incidents?node=b-", headers=reader).json()["items"]
    assert [i["id"] for i in by_node] == [driver]
    first = client.get("/api/v1/shared-incidents?limit=1", headers=reader).json()
    rest = client.get(f"/api/v1/shared-incidents?limit=1&cursor={first['next_cursor']}", headers=reader).json()
    assert [i["id"] for i in rest["items"]] == [switch] and rest["next_cursor"] is None

    detail = client.get(f"/api/v1/shared-incidents/{switch}", headers=reader).json()
    assert detail["component_kind"] == "switch" and detail["state"] == "open"
    assert {(d["kind"], d["node"], d["shared_incident_id"]) for d in detail["decisions"]} == {
        ("cordon", n, switch) for n in ("a-1", "a-2", "a-3")
    }
    # The cordons reach schedulers through the decisions API like any other.
    pending = client.get("/api/v1/decisions?kind=cordon&state=pending", headers=reader).json()["items"]
    assert {d["shared_incident_id"] for d in pending} == {switch, driver}

    # Resolving takes an operator and a reason.
    assert (
        client.post(f"/api/v1/shared-incidents/{switch}/resolve", json={"reason": "x"}, headers=reader).status_code
        == 403
    )
    operator = bearer(make_token("operator"))
    assert client.post(f"/api/v1/shared-incidents/{switch}/resolve", json={}, headers=operator).status_code == 422
    done = client.post(
        f"/api/v1/shared-incidents/{switch}/resolve", json={"reason": "leaf-7 replaced"}, headers=operator
    )
    assert done.status_code == 200
    assert done.json()["state"] == "resolved" and "leaf-7 replaced" in done.json()["resolution"]
    again = client.post(f"/api/v1/shared-incidents/{switch}/resolve", json={"reason": "again"}, headers=operator)
    assert again.json()["resolution"] == done.json()["resolution"]
    states = client.get("/api/v1/shared-incidents?state=resolved", headers=reader).json()["items"]
    assert [i["id"] for i in states] == [switch]


def test_bad_input_is_a_clear_4xx(client: Any, make_token: Any) -> None:
    reader = bearer(make_token("scheduler"))
    assert client.get("/api/v1/shared-incidents/999999", headers=reader).status_code == 404
    bad_kind = client.get("/api/v1/shared-incidents?component_kind=moon", headers=reader)
    assert bad_kind.status_code == 422 and "switch" in bad_kind.text
    assert client.get("/api/v1/shared-incidents?cursor=zzz", headers=reader).status_code == 422
    assert client.get("/api/v1/shared-incidents").status_code == 401
