"""API tokens, for admins only: the list, a form that issues one (its value shown once), and revoke."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.db import session_scope
from service.deps import DbSession
from service.errors import FaultlineError, InvalidInput
from service.models.auth import SCOPES
from service.params import Id
from service.tokens import service as tokens
from service.tokens.schemas import TokenCreated, TokenIn, TokenState
from service.ui.auth import AdminDep, FormViewer
from service.ui.render import page, redirect
from service.ui.views import admin
from service.validation import validated

router = APIRouter(include_in_schema=False)
PAGE_SIZE = 100
TOKEN_STATES: tuple[str, ...] = ("active", "expired", "revoked")
BLANK_FORM = {"scope": "agent", "name": "", "node_name": "", "ttl": "", "unit": "days"}


def _render(
    request: Request,
    session: Session,
    *,
    scope: str = "",
    state: str = "",
    cursor: str = "",
    form: dict[str, str] | None = None,
    error: FaultlineError | None = None,
    action_error: FaultlineError | None = None,
    created: TokenCreated | None = None,
    status_code: int = 200,
) -> Response:
    if scope and scope not in SCOPES:
        raise InvalidInput(f"scope: {scope!r} is not one of {', '.join(SCOPES)}")
    if state and state not in TOKEN_STATES:
        raise InvalidInput(f"state: {state!r} is not one of {', '.join(TOKEN_STATES)}")
    chosen: TokenState | None = state or None  # type: ignore[assignment]
    result = tokens.list_page(
        session, scope=scope or None, state=chosen, now=datetime.now(UTC), limit=PAGE_SIZE, cursor=cursor or None
    )
    params = {k: v for k, v in {"scope": scope, "state": state, "cursor": cursor}.items() if v}
    context: dict[str, Any] = {
        "page": result,
        "params": params,
        "scopes": SCOPES,
        "states": TOKEN_STATES,
        "units": admin.DURATION_UNITS,
        "form": form or BLANK_FORM,
        "errors": admin.error_lines(error) if error else [],
        "action_errors": admin.error_lines(action_error) if action_error else [],
        "created": created,
        "return_to": "/tokens" + (f"?{urlencode(params)}" if params else ""),
    }
    response = page(request, "tokens.html", context, status_code=status_code)
    if created is not None:
        # The only page that carries a token's value: no cache may keep a copy.
        response.headers["Cache-Control"] = "no-store"
    return response


@router.get("/tokens")
def token_list(
    request: Request,
    session: DbSession,
    _: AdminDep,
    scope: str = "",
    state: str = "",
    cursor: Annotated[str, Query()] = "",
) -> Response:
    return _render(request, session, scope=scope, state=state, cursor=cursor)


def _token_in(form: dict[str, str]) -> TokenIn:
    """The API's schema over the form's fields: the same rules, the same messages."""
    ttl_s = admin.duration_s(form["ttl"], form["unit"], field="ttl_s")
    return validated(
        TokenIn,
        scope=form["scope"],
        name=form["name"].strip() or None,
        node_name=form["node_name"].strip() or None,
        ttl_s=ttl_s,
    )


@router.post("/tokens")
def create_token(
    request: Request,
    _: AdminDep,
    __: FormViewer,
    scope: Annotated[str, Form()] = "",
    name: Annotated[str, Form()] = "",
    node_name: Annotated[str, Form()] = "",
    ttl: Annotated[str, Form()] = "",
    unit: Annotated[str, Form()] = "days",
) -> Response:
    form = {"scope": scope, "name": name, "node_name": node_name, "ttl": ttl, "unit": unit}
    try:
        token_in = _token_in(form)
        with session_scope(request.app.state.sessionmaker) as session:
            created = tokens.issue(session, token_in=token_in, now=datetime.now(UTC))
    except FaultlineError as exc:
        with session_scope(request.app.state.sessionmaker) as session:
            return _render(request, session, form=form, error=exc, status_code=exc.status_code)
    # Not a redirect: the value exists only in this response (a flash cookie would be a copy of the secret).
    with session_scope(request.app.state.sessionmaker) as session:
        return _render(request, session, created=created, status_code=201)


@router.post("/tokens/{token_id}/revoke")
def revoke_token(
    request: Request, token_id: Id, _: AdminDep, __: FormViewer, return_to: Annotated[str, Form()] = "/tokens"
) -> Response:
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            record = tokens.to_out(tokens.revoke(session, token_id=token_id), now=datetime.now(UTC))
    except FaultlineError as exc:
        with session_scope(request.app.state.sessionmaker) as session:
            return _render(request, session, action_error=exc, status_code=exc.status_code)
    label = record.name or record.prefix
    return redirect(request, return_to, flash=f"Token #{record.id} ({label}, {record.scope}) revoked.")
