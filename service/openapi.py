"""The OpenAPI document: FastAPI's, plus the hand-documented ingest endpoint, bearer security, and the
error answers every operation can give, in the API's one error shape, so clients and fuzzers see the
whole contract."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.errors import ErrorBody
from service.ingest import routes as ingest_routes
from service.ingest.schemas import IngestBatch, IngestResult

# Operations anyone may call: no token, so no 401 or 403.
PUBLIC = {("/healthz", "get")}
_METHODS = ("get", "post", "put", "patch", "delete")
_COMMON = {
    "401": "No token, or one that is unknown, revoked or expired",
    "403": "The token's scope does not allow this, or a node-bound token names another node",
    "422": "Invalid input: `details` names each offending field",
    "503": "The database is unavailable; retry after `Retry-After` seconds",
}


def build(app: FastAPI) -> dict[str, Any]:
    """The document, built once per app."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, model in (("IngestBatch", IngestBatch), ("IngestResult", IngestResult), ("Error", ErrorBody)):
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[name] = model_schema
    # A copy: the error documentation below edits it in place.
    schema["paths"] = {ingest_routes.PATH: copy.deepcopy(ingest_routes.OPENAPI_PATH_ITEM), **schema["paths"]}
    schema["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `faultline token create --scope agent|scheduler|operator|admin`.",
        }
    }
    schema["security"] = [{"bearer": []}]
    _document_errors(schema)
    _add_links(schema)
    app.openapi_schema = schema
    return schema


# Which answers supply the ids other operations take: (operation, status) -> {target: {parameter: value}}.
# For clients (a created silence's id is where to expire it) and for a fuzzer's stateful phase.
_FIRST_ID = "$response.body#/items/0/id"
_LINKS: dict[tuple[str, str], dict[str, dict[str, str]]] = {
    ("register_job", "200"): {op: {"job_id": "$response.body#/job_id"} for op in ("get_job", "request_stack_dump")},
    ("request_stack_dump", "201"): {
        "get_stack_dumps": {"job_id": "$response.body#/job_id", "directive_id": "$response.body#/id"}
    },
    ("list_incidents", "200"): {"get_incident": {"incident_id": _FIRST_ID}},
    ("list_decisions", "200"): {
        op: {"decision_id": _FIRST_ID}
        for op in ("get_decision", "acknowledge_decision", "approve_decision", "reject_decision", "override_decision")
    },
    ("list_nodes", "200"): {
        op: {"name": "$response.body#/items/0/name"} for op in ("get_node", "cordon_node", "repair_node", "return_node")
    },
    ("create_channel", "201"): {
        op: {"channel_id": "$response.body#/id"}
        for op in ("get_channel", "update_channel", "test_channel", "delete_channel")
    },
    ("list_channels", "200"): {"get_channel": {"channel_id": _FIRST_ID}},
    ("list_deliveries", "200"): {"retry_delivery": {"delivery_id": _FIRST_ID}},
    ("create_silence", "201"): {op: {"silence_id": "$response.body#/id"} for op in ("get_silence", "expire_silence")},
    ("list_silences", "200"): {"get_silence": {"silence_id": _FIRST_ID}},
    ("create_token", "201"): {op: {"token_id": "$response.body#/id"} for op in ("get_token", "revoke_token")},
    ("list_tokens", "200"): {"get_token": {"token_id": _FIRST_ID}},
}


def _add_links(schema: dict[str, Any]) -> None:
    for item in schema["paths"].values():
        for method in _METHODS:
            operation = item.get(method) or {}
            for (source, status), targets in _LINKS.items():
                if operation.get("operationId") == source:
                    operation["responses"][status]["links"] = {
                        target: {"operationId": target, "parameters": parameters}
                        for target, parameters in targets.items()
                    }


def _document_errors(schema: dict[str, Any]) -> None:
    """Every operation lists the errors it can answer, each with the Error body (FastAPI's own 422 schema
    is not what the API sends)."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, item in schema["paths"].items():
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            public = (path, method) in PUBLIC
            if public:
                operation["security"] = []
            for code, description in _COMMON.items():
                if not (public and code in ("401", "403")):
                    responses.setdefault(code, {"description": description})
            if "{" in path:
                responses.setdefault("404", {"description": "No such resource"})
            for code, response in responses.items():
                if code[0] in "45" and not (public and code == "503"):
                    response["content"] = error
    for unused in ("HTTPValidationError", "ValidationError"):
        schema["components"]["schemas"].pop(unused, None)
