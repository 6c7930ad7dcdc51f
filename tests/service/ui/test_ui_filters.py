"""One filter behaviour on every list (issue 40): a name filter matches a part of the name, case-insensitively, on
the Incidents, Decisions, Nodes and Jobs pages and in their APIs for people (the decisions API, which schedulers act
on, keeps exact names); an unknown state or kind is a 422 that names the values it may take, on a page and in the
API, never a silently empty or unfiltered list."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session

from tests import rows
from tests.conftest import bearer


def _seed(session: Session) -> dict[str, Any]:
    demo, other = rows.job(session, "demo-job"), rows.job(session, "other-run")
    n1, n5, n15 = rows.node(session, "node-001"), rows.node(session, "node-005"), rows.node(session, "node-015")
    i1 = rows.incident(session, job=demo, suspects=["node-001"], anchor="node-001")
    i5 = rows.incident(session, job=demo, suspects=["node-005"], root_cause="nvlink", anchor="node-005")
    i15 = rows.incident(session, job=other, suspects=["node-015"], anchor="node-015")
    d1 = rows.decision(session, incident=i1, node=n1)
    d5 = rows.decision(session, incident=i5, node=n5)
    d15 = rows.decision(session, incident=i15, node=n15)
    return {"incidents": (i1.id, i5.id, i15.id), "decisions": (d1.id, d5.id, d15.id)}


def _ids(items: list[dict[str, Any]]) -> set[int]:
    return {i["id"] for i in items}


def test_the_apis_match_a_part_of_a_name(client, session: Session, make_token) -> None:
    made = _seed(session)
    i1, i5, i15 = made["incidents"]
    d1, d5, d15 = made["decisions"]
    token = bearer(make_token("operator"))

    def get(path: str, **params: str) -> list[dict[str, Any]]:
        response = client.get(path, params=params, headers=token)
        assert response.status_code == 200, response.text
        return response.json()["items"]

    assert _ids(get("/api/v1/incidents", job="demo")) == {i1, i5}
    assert _ids(get("/api/v1/incidents", job="DEMO-JOB")) == {i1, i5}
    assert _ids(get("/api/v1/incidents", node="005")) == {i5}
    assert _ids(get("/api/v1/incidents", node="01")) == {i1, i15}
    # The decision API is the one schedulers act on: its names stay exact (the Decisions page matches a part).
    assert _ids(get("/api/v1/decisions", job="demo")) == set()
    assert _ids(get("/api/v1/decisions", node="001")) == set()
    assert _ids(get("/api/v1/decisions", node="node-001")) == {d1}
    assert _ids(get("/api/v1/decisions", job="demo-job")) == {d1, d5}
    assert _ids(get("/api/v1/decisions", job="other-run", node="node-015")) == {d15}
    assert {n["name"] for n in get("/api/v1/nodes", name="005")} == {"node-005"}
    # A wildcard is a character like any other, not a pattern.
    assert get("/api/v1/incidents", job="%") == [] and get("/api/v1/nodes", name="node_0") == []


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/api/v1/incidents", "state", "opened"),
        ("/api/v1/incidents", "severity", "huge"),
        ("/api/v1/incidents", "root_cause", "gremlins"),
        ("/api/v1/decisions", "state", "waiting"),
        ("/api/v1/decisions", "kind", "reboot"),
        ("/api/v1/nodes", "state", "broken"),
    ],
)
def test_an_unknown_filter_value_is_a_422_naming_the_field(client, make_token, path: str, field: str, value: str):
    response = client.get(path, params={field: value}, headers=bearer(make_token("operator")))
    assert response.status_code == 422, response.text
    assert f"query.{field}" in response.json()["message"] and "Input should be" in response.json()["message"]


def test_the_pages_filter_alike(ui, session: Session) -> None:
    made = _seed(session)
    i1, i5, i15 = made["incidents"]
    d1, d5, d15 = made["decisions"]

    incidents = ui.get("/incidents", params={"job": "demo"}).text
    assert f'href="/incidents/{i1}"' in incidents and f'href="/incidents/{i15}"' not in incidents
    by_node = ui.get("/incidents", params={"node": "005"}).text
    assert f'href="/incidents/{i5}"' in by_node and f'href="/incidents/{i1}"' not in by_node
    decisions = ui.get("/decisions", params={"node": "001"}).text
    assert f'id="decision-{d1}"' in decisions and f'id="decision-{d5}"' not in decisions
    decisions = ui.get("/decisions", params={"job": "demo"}).text
    assert f'id="decision-{d5}"' in decisions and f'id="decision-{d15}"' not in decisions
    nodes = ui.get("/nodes", params={"name": "005"}).text
    assert 'href="/nodes/node-005"' in nodes and 'href="/nodes/node-001"' not in nodes
    jobs = ui.get("/jobs", params={"name": "demo"}).text
    assert 'href="/jobs/demo-job"' in jobs and 'href="/jobs/other-run"' not in jobs


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/incidents", {"state": "opened"}),
        ("/decisions", {"state": "waiting"}),
        ("/decisions", {"kind": "reboot"}),
        ("/nodes", {"state": "broken"}),
        ("/jobs", {"state": "paused"}),
        ("/silences", {"state": "forever"}),
    ],
)
def test_an_unknown_state_on_a_page_says_so(ui, path: str, params: dict[str, str]) -> None:
    response = ui.get(path, params=params)
    field, value = next(iter(params.items()))
    assert response.status_code == 422
    assert f"{field}: &#39;{value}&#39; is not one of" in response.text
