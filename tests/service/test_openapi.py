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


def test_links_name_real_operations_and_parameters(client) -> None:
    """Links (a created silence's id is where to expire it) must follow the routes as they change."""
    schema = client.get("/openapi.json").json()
    operations = {op["operationId"]: (path, op) for _, path, op in _operations(schema)}
    links = [
        link
        for _, _, op in _operations(schema)
        for r in op["responses"].values()
        for link in r.get("links", {}).values()
    ]
    assert len(links) >= 20
    for link in links:
        path, op = operations[link["operationId"]]
        names = {p["name"] for p in op.get("parameters", [])}
        assert set(link["parameters"]) <= names, (link, path)


def test_every_error_answer_is_documented_in_the_error_shape(client) -> None:
    schema = client.get("/openapi.json").json()
    for method, path, op in _operations(schema):
        errors = {code: r for code, r in op["responses"].items() if code[0] in "45"}
        if path != "/healthz":
            assert {"401", "403", "422", "503"} <= set(errors), (method, path)
            assert all(r["content"]["application/json"]["schema"]["$ref"].endswith("/Error") for r in errors.values())
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_a_decision_names_its_gpu_by_index_or_by_pci_bus_id(client) -> None:
    """A scheduler reads `gpu`, else `gpu_pci`, for reset_gpu: both documented, both nullable."""
    decision = client.get("/openapi.json").json()["components"]["schemas"]["DecisionOut"]
    gpu, pci = decision["properties"]["gpu"], decision["properties"]["gpu_pci"]
    assert {"type": "null"} in gpu["anyOf"] and {"type": "null"} in pci["anyOf"]
    assert "gpu_pci" in gpu["description"] and "nvidia-smi -r -i" in pci["description"]
    assert pci["examples"] == ["0000:3b:00.0"]
