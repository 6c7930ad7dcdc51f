"""A scheduler loop written only from the OpenAPI schema, run against a real API process.

The loop knows operation ids and nothing else: it reads paths, parameters and the acknowledgement's body
schema from /openapi.json, long-polls for pending evictions, acts, and acknowledges.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import sessionmaker

from service.tokens import service as tokens
from tests import rows
from tests.procs import api_server

pytestmark = pytest.mark.slow


class SchemaClient:
    """Calls operations by id, with paths and parameter names taken from the schema."""

    def __init__(self, base: str, token: str) -> None:
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        self.schema = self.http.get("/openapi.json").json()
        self.ops = {
            op["operationId"]: (method.upper(), path, op)
            for path, item in self.schema["paths"].items()
            for method, op in item.items()
        }

    def parameters(self, operation: str) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.ops[operation][2].get("parameters", [])}

    def body_schema(self, operation: str) -> dict[str, Any]:
        ref = self.ops[operation][2]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return self.schema["components"]["schemas"][ref.rsplit("/", 1)[1]]

    def call(self, operation: str, *, path: dict[str, Any] | None = None, **kwargs: Any) -> httpx.Response:
        method, template, _ = self.ops[operation]
        if "query" in kwargs:
            unknown = set(kwargs["query"]) - set(self.parameters(operation))
            assert not unknown, f"{operation} takes no {unknown}"
        return self.http.request(
            method, template.format(**(path or {})), params=kwargs.get("query"), json=kwargs.get("json")
        )


def _enum(schema: dict[str, Any]) -> set[str]:
    """The allowed values of a parameter or property, through anyOf (Optional) wrappers."""
    values = set(schema.get("enum", []))
    for option in schema.get("anyOf", []):
        values |= set(option.get("enum", []))
    return values


def pending_evictions(client: SchemaClient, *, wait: float) -> list[dict[str, Any]]:
    """Every page of pending evictions, holding the first request up to `wait` seconds."""
    items: list[dict[str, Any]] = []
    query: dict[str, Any] = {"state": "pending", "kind": "evict", "wait": wait, "limit": 2}
    while True:
        page = client.call("list_decisions", query=query).raise_for_status().json()
        items += page["items"]
        if not page["next_cursor"]:
            return items
        query = {"state": "pending", "kind": "evict", "limit": 2, "cursor": page["next_cursor"]}


def test_a_scheduler_loop_from_the_schema_lists_acts_and_acknowledges(committed) -> None:
    factory = sessionmaker(bind=committed, expire_on_commit=False)
    with factory() as session:
        token = tokens.create(session, scope="scheduler", name="loop").token
        evictions = [rows.eviction(session) for _ in range(3)]
        session.commit()

    with api_server() as url:
        client = SchemaClient(url, token)
        # What the loop relies on is in the schema: the filters, the long poll, the outcomes, the examples.
        assert {"state", "kind", "wait", "cursor", "limit"} <= set(client.parameters("list_decisions"))
        assert "pending" in _enum(client.parameters("list_decisions")["state"]["schema"])
        ack_body = client.body_schema("acknowledge_decision")
        assert {"done", "failed", "rejected"} == _enum(ack_body["properties"]["outcome"])
        assert ack_body.get("examples")
        assert "409" in client.ops["acknowledge_decision"][2]["responses"]

        acted: list[str] = []
        for decision in pending_evictions(client, wait=5):
            acted.append(decision["node"])  # the scheduler's own action (cordon, drain) goes here
            ack = client.call(
                "acknowledge_decision",
                path={"decision_id": decision["id"]},
                json={"outcome": "done", "message": "drained"},
            )
            assert ack.status_code == 200 and ack.json()["state"] == "done"
        assert sorted(acted) == sorted(n.name for _, n, _, _ in evictions)
        for node in acted:
            state = client.call("get_node", path={"name": node}).json()["state"]
            assert state == "evicted"

        # The next poll waits; a decision written meanwhile is in the answer to that same request.
        answer: dict[str, Any] = {}

        def poll() -> None:
            answer["items"] = pending_evictions(client, wait=30)
            answer["at"] = time.monotonic()

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(1.5)
        with factory() as session:
            _, late_node, _, late = rows.eviction(session)
            session.commit()
        written = time.monotonic()
        poller.join(timeout=40)
        assert [d["id"] for d in answer["items"]] == [late.id], "the long poll did not return the new decision"
        print(f"long poll answered {answer['at'] - written:.2f} s after the decision was committed")
        # Acknowledging again is harmless.
        for _ in range(2):
            again = client.call("acknowledge_decision", path={"decision_id": late.id}, json={"outcome": "done"})
            assert again.status_code == 200
        assert client.call("get_node", path={"name": late_node.name}).json()["state"] == "evicted"
