"""The OpenAPI schema is the scheduler's contract: stable operation ids, and an example for every answer."""

from __future__ import annotations

from typing import Any


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in schema["paths"].items() for method, op in item.items()]


def test_every_successful_json_answer_has_an_example(client) -> None:
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    missing = []
    for method, path, op in _operations(schema):
        for code, response in op["responses"].items():
            content = response.get("content", {}).get("application/json")
            if not code.startswith("2") or content is None:
                continue
            body = content.get("schema", {})
            ref = body.get("$ref") or body.get("items", {}).get("$ref", "")  # an object, or a list of them
            component = components.get(ref.rsplit("/", 1)[-1], {})
            if not (content.get("example") or content.get("examples") or component.get("examples")):
                missing.append(f"{method.upper()} {path} {code}")
    assert missing == []


def test_operation_ids_are_unique_and_named_after_what_they_do(client) -> None:
    ids = [op["operationId"] for _, _, op in _operations(client.get("/openapi.json").json())]
    assert len(ids) == len(set(ids))
    assert {"list_decisions", "acknowledge_decision", "list_nodes", "get_node", "cordon_node"} <= set(ids)
