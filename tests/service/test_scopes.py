"""Who may call what: every API endpoint against every token scope.

SCOPES_BY_ROUTE is the source of truth. A route the app serves that is not in it fails the test, so no
endpoint ships without someone deciding its scopes; a route in it that the app does not serve fails too.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute

from service.ingest.routes import PATH as INGEST_PATH
from service.models.auth import SCOPES
from tests.conftest import bearer

BUNDLE_UPLOAD = "/api/v1/nodes/{node}/bundles/{bundle_id}"  # an agent's evidence bundle: like its batches
AGENT = frozenset({"agent"})
READ = frozenset({"scheduler", "operator", "admin"})
OPERATOR = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})
ENROL = frozenset({"enrol"})
ALERTS = frozenset({"agent", "operator", "admin"})

SCOPES_BY_ROUTE: dict[tuple[str, str], frozenset[str]] = {
    # Agents: their batches (a middleware ahead of routing), and Alertmanager's webhook.
    ("POST", INGEST_PATH): AGENT,
    ("POST", "/api/v1/alertmanager"): ALERTS,
    # Schedulers register jobs, read what faultline found and decided, and acknowledge decisions.
    ("POST", "/api/v1/jobs"): READ,
    ("GET", "/api/v1/jobs/{job_id}"): READ,
    ("POST", "/api/v1/jobs/{job_id}/end"): READ,
    ("GET", "/api/v1/jobs/{job_id}/ettr"): READ,
    ("GET", "/api/v1/stalled-jobs"): READ,
    ("POST", "/api/v1/jobs/{job_id}/stack-dumps"): OPERATOR,
    ("GET", "/api/v1/jobs/{job_id}/stack-dumps/{directive_id}"): READ,
    # Evidence bundles: the node's agent uploads one per `bundle` directive; readers list and download them.
    ("PUT", BUNDLE_UPLOAD): AGENT,
    ("GET", "/api/v1/incidents/{incident_id}/bundles"): READ,
    ("GET", "/api/v1/nodes/{node}/bundles"): READ,
    ("GET", "/api/v1/bundles/{bundle_id}"): READ,
    ("GET", "/api/v1/bundles/{bundle_id}/info"): READ,
    ("GET", "/api/v1/incidents"): READ,
    ("GET", "/api/v1/incidents/{incident_id}"): READ,
    ("GET", "/api/v1/incidents/{incident_id}/repair-times"): READ,
    ("POST", "/api/v1/incidents/{incident_id}/resolve"): OPERATOR,
    ("POST", "/api/v1/incidents/{incident_id}/acknowledge"): OPERATOR,
    ("GET", "/api/v1/repair-times"): READ,
    ("GET", "/api/v1/unknown-lines"): READ,
    ("GET", "/api/v1/spares"): READ,
    ("GET", "/api/v1/jobs/{job_id}/spares"): READ,
    ("GET", "/api/v1/decisions"): READ,
    ("GET", "/api/v1/decisions/{decision_id}"): READ,
    ("POST", "/api/v1/decisions/{decision_id}/ack"): READ,
    ("POST", "/api/v1/decisions/{decision_id}/approve"): OPERATOR,
    ("POST", "/api/v1/decisions/{decision_id}/reject"): OPERATOR,
    ("POST", "/api/v1/decisions/{decision_id}/override"): OPERATOR,
    ("GET", "/api/v1/nodes"): READ,
    ("GET", "/api/v1/nodes/{name}"): READ,
    ("GET", "/api/v1/nodes/{name}/ladder"): READ,
    ("GET", "/api/v1/nvlink-domains"): READ,
    ("GET", "/api/v1/nvlink-domains/{cluster_uuid}"): READ,
    ("GET", "/api/v1/shared-incidents"): READ,
    ("GET", "/api/v1/shared-incidents/{incident_id}"): READ,
    ("POST", "/api/v1/shared-incidents/{incident_id}/resolve"): OPERATOR,
    ("POST", "/api/v1/nodes/{name}/cordon"): OPERATOR,
    ("POST", "/api/v1/nodes/{name}/checks"): OPERATOR,
    ("GET", "/api/v1/nodes/{name}/checks"): READ,
    # A job's preflight (agents/preflight/), run on the nodes with an agent's token: its results are data.
    ("POST", "/api/v1/preflight"): frozenset({"agent", "admin"}),
    ("GET", "/api/v1/preflight/criteria"): AGENT | READ,
    ("POST", "/api/v1/nodes/{name}/repair"): OPERATOR,
    # A person returns a node; a scheduler reports one it put back in service (service/nodes/returns.py).
    ("POST", "/api/v1/nodes/{name}/return"): READ,
    ("GET", "/api/v1/silences"): READ,
    ("GET", "/api/v1/silences/{silence_id}"): READ,
    ("POST", "/api/v1/silences"): OPERATOR,
    ("DELETE", "/api/v1/silences/{silence_id}"): OPERATOR,
    # Planned maintenance windows (service/planned/): people announce and cancel; a node's agent reports its cloud's.
    ("POST", "/api/v1/nodes/{name}/maintenance"): OPERATOR,
    ("GET", "/api/v1/nodes/{name}/maintenance"): READ,
    ("GET", "/api/v1/maintenance"): READ,
    ("DELETE", "/api/v1/nodes/{name}/maintenance/{window_id}"): OPERATOR,
    ("PUT", "/api/v1/nodes/{name}/maintenance/cloud"): AGENT,
    ("GET", "/api/v1/breaker"): READ,
    ("POST", "/api/v1/breaker/reset"): OPERATOR,
    # Chat channels hold webhook URLs (secrets): people only.
    ("POST", "/api/v1/channels"): OPERATOR,
    ("GET", "/api/v1/channels"): OPERATOR,
    ("GET", "/api/v1/channels/{channel_id}"): OPERATOR,
    ("PATCH", "/api/v1/channels/{channel_id}"): OPERATOR,
    ("DELETE", "/api/v1/channels/{channel_id}"): OPERATOR,
    ("POST", "/api/v1/channels/{channel_id}/test"): OPERATOR,
    ("GET", "/api/v1/deliveries"): OPERATOR,
    ("POST", "/api/v1/deliveries/{delivery_id}/retry"): OPERATOR,
    # Tokens make principals: admins only.
    ("POST", "/api/v1/tokens"): ADMIN,
    ("GET", "/api/v1/tokens"): ADMIN,
    ("GET", "/api/v1/tokens/{token_id}"): ADMIN,
    ("DELETE", "/api/v1/tokens/{token_id}"): ADMIN,
    # Agents trade an enrolment token for their node's own token; that is all an enrolment token can do.
    ("POST", "/api/v1/tokens/enrol"): ENROL,
}
# Served without a token: probes and Prometheus scrapes.
PUBLIC = {("GET", "/healthz"), ("GET", "/metrics")}
# Endpoints an agent token reaches; and the one admin does not (agent data comes from agents).
CLOUD_EVENTS = ("PUT", "/api/v1/nodes/{name}/maintenance/cloud")  # an agent's report of its cloud's scheduled events
AGENT_ALLOWED = {("POST", INGEST_PATH), ("POST", "/api/v1/alertmanager"), ("PUT", BUNDLE_UPLOAD), CLOUD_EVENTS}
AGENT_ALLOWED |= {("POST", "/api/v1/preflight"), ("GET", "/api/v1/preflight/criteria")}
NOT_FOR_ADMIN = {("POST", INGEST_PATH), ("POST", "/api/v1/tokens/enrol"), ("PUT", BUNDLE_UPLOAD), CLOUD_EVENTS}
# What a scheduler may change: its jobs and its acknowledgements. Everything else it only reads.
SCHEDULER_WRITES = {
    ("POST", "/api/v1/jobs"),
    ("POST", "/api/v1/jobs/{job_id}/end"),
    ("POST", "/api/v1/decisions/{decision_id}/ack"),
    ("POST", "/api/v1/nodes/{name}/return"),
}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
# The API's docs: the schema, Swagger UI and ReDoc pages and their files (fastapi-offline): no data behind them.
# The API docs and their assets are public, as FastAPI serves them (service/api_docs.py serves ReDoc offline).
FRAMEWORK = {
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/api-docs/redoc.standalone.js",
    "/static-offline-docs",
}
# The web UI answers people with a session cookie, not a bearer token: every page and form outside /api needs a
# signed-in operator or admin, except these; pages under UI_ADMIN need an admin (tests/service/ui/test_ui_auth.py: how).
UI_PUBLIC = {("GET", "/login"), ("POST", "/login"), ("*", "/static")}
UI_ADMIN = "/tokens"


def _is_ui(key: tuple[str, str]) -> bool:
    return not key[1].startswith("/api/") and key not in PUBLIC and key[1] not in FRAMEWORK


def _shape(path: str) -> str:
    """A path with its parameters unnamed, so `{id}` vs `{channel_id}` is not a difference in scopes."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def _served(app: Any) -> dict[tuple[str, str], Any]:
    """(method, path shape) -> route, for every route the app serves, plus the ingest middleware's endpoint."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before lazily included routers: app.routes is already flat
        contexts: Iterator[Any] = iter(app.routes)
    else:
        contexts = iter_route_contexts(app.routes)
    served: dict[tuple[str, str], Any] = {("POST", _shape(INGEST_PATH)): None}
    for context in contexts:
        route = getattr(context, "original_route", context)
        path = context.path
        if path in FRAMEWORK and (not isinstance(route, APIRoute) or not route.include_in_schema):
            continue
        methods = context.methods or {"*"}  # a mount: no methods, and nobody decided anything for it
        for method in methods - {"HEAD"}:
            served[(method, _shape(path))] = context
    return served


@pytest.fixture(scope="module")
def served() -> dict[tuple[str, str], Any]:
    from service.app import create_app
    from service.config import get_settings

    return _served(create_app(get_settings()))


def test_every_served_route_has_decided_scopes(served):
    decided = {(method, _shape(path)) for method, path in [*SCOPES_BY_ROUTE, *PUBLIC]}
    undecided = sorted(key for key in served if key not in decided and not _is_ui(key))
    assert not undecided, (
        f"routes without a scope decision: {undecided}; add each to SCOPES_BY_ROUTE (or PUBLIC) in "
        "tests/service/test_scopes.py"
    )


def test_every_route_in_the_table_is_served(served):
    missing = sorted(f"{method} {path}" for method, path in SCOPES_BY_ROUTE if (method, _shape(path)) not in served)
    assert not missing, f"routes in the scope table that the app does not serve: {missing}"


def test_the_table_keeps_the_policy():
    """The invariants behind the table: agents only write data, schedulers write little, admins do all else."""
    for (method, path), scopes in SCOPES_BY_ROUTE.items():
        key = (method, path)
        assert scopes <= set(SCOPES), key
        assert ("agent" in scopes) == (key in AGENT_ALLOWED), key
        assert ("admin" in scopes) != (key in NOT_FOR_ADMIN), key
        if method in WRITES and key not in SCHEDULER_WRITES:
            assert "scheduler" not in scopes, key
        if "scheduler" in scopes:
            assert "operator" in scopes, key


def _value(route: Any, name: str) -> str:
    """A path parameter value that passes validation and names nothing: auth must answer first anyway."""
    params = {p.name: p.field_info.annotation for p in route.original_route.dependant.path_params} if route else {}
    kind = params.get(name)
    if kind is int:
        return "987654321"
    if kind is uuid.UUID:
        return str(uuid.UUID(int=987654321))
    return "no-such-thing"


def _url(path: str, route: Any) -> str:
    return re.sub(r"\{([^}:]*)(:[^}]*)?\}", lambda m: _value(route, m.group(1)), path)


@pytest.fixture
def tokens(make_token: Any) -> dict[str | None, dict[str, str]]:
    headers: dict[str | None, dict[str, str]] = {scope: bearer(make_token(scope, name=scope)) for scope in SCOPES}
    headers[None] = {}
    headers["invalid"] = bearer("fl_" + "x" * 43)
    return headers


@pytest.mark.parametrize(("method", "path"), sorted(SCOPES_BY_ROUTE), ids=lambda v: v)
def test_scopes(client, served, tokens, method, path):
    key = (method, _shape(path))
    if key not in served:
        pytest.fail(f"{method} {path} is in the scope table but not served (yet?)")
    url = _url(path, served[key])
    allowed = SCOPES_BY_ROUTE[(method, path)]
    answers: dict[str | None, int] = {}
    for scope, headers in tokens.items():
        # A JSON body that parses: the body is validated after the auth dependency, never before.
        body = {} if method in WRITES and method != "DELETE" else None
        answers[scope] = client.request(method, url, json=body, headers=headers).status_code
    expected_denials = {None: 401, "invalid": 401} | {s: 403 for s in SCOPES if s not in allowed}
    assert {s: answers[s] for s in expected_denials} == expected_denials, answers
    granted = {s: answers[s] for s in allowed}
    assert all(status not in (401, 403) and status < 500 for status in granted.values()), granted


@pytest.mark.parametrize(("method", "path"), sorted(PUBLIC))
def test_public_routes_need_no_token(client, method, path):
    assert client.request(method, path).status_code not in (401, 403)


def test_every_ui_page_and_form_needs_a_signed_in_person(client, served, make_token):
    """A stranger is sent to sign in; an operator reaches all but the admin pages; an admin reaches all."""
    from tests.conftest import sign_in

    ui_routes = sorted(key for key in served if _is_ui(key) and key not in UI_PUBLIC)
    assert ("GET", "/") in ui_routes
    problems = []
    for method, path in ui_routes:
        url = _url(path, served[(method, path)])
        answer = client.request(method, url, follow_redirects=False)
        if answer.status_code != 303 or not answer.headers["location"].startswith("/login?next="):
            problems.append(f"stranger {method} {path}: {answer.status_code}")
    operator = sign_in(client, make_token("operator", name="op"))
    # Signing out last: it ends the session the other requests use.
    for method, path in sorted(ui_routes, key=lambda key: key == ("POST", "/logout")):
        url = _url(path, served[(method, path)])
        data = {"csrf_token": operator.csrf} if method != "GET" else None
        status = client.request(method, url, data=data, follow_redirects=False).status_code
        admin_only = path.startswith(UI_ADMIN)
        if (admin_only and status != 403) or (not admin_only and status in (401, 403)) or status >= 500:
            problems.append(f"operator {method} {path}: {status}")
    assert not problems, problems


def test_every_ui_form_refuses_a_post_without_the_session_csrf_token(client, served, make_token):
    """Signed in as an admin (who may post every form), a post without the CSRF token changes nothing."""
    from tests.conftest import sign_in

    forms = sorted(key for key in served if _is_ui(key) and key[0] == "POST" and key not in UI_PUBLIC)
    assert len(forms) >= 10
    sign_in(client, make_token("admin", name="adm"))
    problems = []
    for method, path in forms:
        answer = client.request(method, _url(path, served[(method, path)]), data={}, follow_redirects=False)
        if answer.status_code != 403 or "CSRF" not in answer.text:
            problems.append(f"{method} {path}: {answer.status_code}")
    assert not problems, problems
