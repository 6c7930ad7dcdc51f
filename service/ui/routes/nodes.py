"""Nodes: the filtered list, one node's page, and the operator's cordon, repair and return forms."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.db import session_scope
from service.deps import DbSession
from service.errors import FaultlineError, InvalidInput
from service.models.nodes import NODE_STATES
from service.nodes import service as nodes
from service.nodes.schemas import CordonIn, NodeDetail, ReturnIn
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import page, redirect
from service.ui.views import checks as checks_view
from service.ui.views import gpus, machine
from service.ui.views import nodes as view
from service.validation import validated

router = APIRouter(include_in_schema=False)
M = TypeVar("M", bound=BaseModel)
_LEMON = {"yes": True, "no": False}


@router.get("/nodes")
def node_list(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    state: str = "",
    lemon: str = "",
    name: str = "",
    cursor: str = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Response:
    # A typo in a hand-edited URL says so rather than showing a list that looks complete.
    if state and state not in NODE_STATES:
        raise InvalidInput(f"state: {state!r} is not one of {', '.join(NODE_STATES)}")
    if lemon and lemon not in _LEMON:
        raise InvalidInput(f"lemon: {lemon!r} is not one of {', '.join(_LEMON)}")
    params = {k: v for k, v in {"state": state, "lemon": lemon, "name": name, "cursor": cursor}.items() if v}
    result = nodes.list_nodes(
        session,
        state=state or None,
        lemon=_LEMON.get(lemon),
        name=name.strip() or None,
        limit=limit,
        cursor=cursor or None,
    )
    names = gpus.for_nodes(session, [n.name for n in result.items])
    return page(request, "nodes.html", {"page": result, "params": params, "states": NODE_STATES, "gpus": names})


@router.get("/nodes/{name}")
def node_detail(request: Request, name: str, session: DbSession, _: ViewerDep) -> Response:
    now = datetime.now(UTC)
    v = view.node_view(session, name=name, now=now)
    subjects = machine.machine_rows(session, name=name, now=now, window_s=view.COUNTERS_WINDOW_S)
    checks = checks_view.node_checks(session, name=name, now=now)
    context = {"v": v, "cells": [h for h, _ in view.COUNTER_CELLS], "subjects": subjects, "checks": checks}
    return page(request, "node.html", {**context, "gpus": gpus.for_nodes(session, [name])})


def _body(model: type[M], **fields: Any) -> M:
    """The form as the API's body, so the UI accepts what the API accepts; a missing reason said plainly."""
    if not fields.get("reason"):
        raise InvalidInput("give a reason: it is recorded in the node's history")
    return validated(model, **fields)


def _act(request: Request, name: str, verb: str, action: Callable[[Session], NodeDetail]) -> Response:
    """One transition in its own transaction; a refusal (409, bad input) comes back as a flash and changes nothing."""
    back = f"/nodes/{quote(name, safe='')}"
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            detail = action(session)
    except FaultlineError as exc:
        return redirect(request, back, flash=f"Not done: {exc.message}", refused=True)
    return redirect(request, back, flash=f"{name} {verb}: it is now {detail.state.replace('_', ' ')}.")


@router.post("/nodes/{name}/cordon")
def cordon(request: Request, name: str, viewer: FormViewer, reason: Annotated[str, Form()] = "") -> Response:
    settings = request.app.state.settings

    def run(session: Session) -> NodeDetail:
        body = _body(CordonIn, reason=reason.strip())
        return nodes.cordon(
            session, name=name, reason=body.reason, actor=viewer.actor, now=datetime.now(UTC), settings=settings
        )

    return _act(request, name, "cordoned", run)


@router.post("/nodes/{name}/repair")
def repair(request: Request, name: str, viewer: FormViewer, reason: Annotated[str, Form()] = "") -> Response:
    def run(session: Session) -> NodeDetail:
        body = _body(CordonIn, reason=reason.strip())
        return nodes.repair(session, name=name, reason=body.reason, actor=viewer.actor, now=datetime.now(UTC))

    return _act(request, name, "sent to repair", run)


@router.post("/nodes/{name}/return")
def return_to_service(
    request: Request,
    name: str,
    viewer: FormViewer,
    reason: Annotated[str, Form()] = "",
    force: Annotated[bool, Form()] = False,
    diagnostics_passed: Annotated[bool, Form()] = False,
    diagnostics_tool: Annotated[str, Form()] = "",
    diagnostics_report: Annotated[str, Form()] = "",
) -> Response:
    settings = request.app.state.settings
    # As the API takes it: a diagnostics report only when the operator says one passed.
    diagnostics = (
        {"passed": True, "tool": diagnostics_tool.strip() or "dcgmi diag", "report": diagnostics_report.strip() or None}
        if diagnostics_passed
        else None
    )

    def run(session: Session) -> NodeDetail:
        body = _body(ReturnIn, reason=reason.strip(), diagnostics=diagnostics, force=force)
        return nodes.return_to_service(
            session,
            name=name,
            reason=body.reason,
            diagnostics=body.diagnostics.model_dump(mode="json") if body.diagnostics else None,
            force=body.force,
            actor=viewer.actor,
            now=datetime.now(UTC),
            settings=settings,
        )

    return _act(request, name, "returned to service" + (" (forced)" if force else ""), run)
