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

from service.bundles import service as bundles
from service.db import session_scope
from service.deps import DbSession
from service.errors import Conflict, FaultlineError, InvalidInput
from service.models.nodes import NODE_STATES
from service.nodes import history, ladder
from service.nodes import service as nodes
from service.nodes.schemas import CordonIn, NodeDetail, ReturnIn
from service.shared_causes import service as shared_causes
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import ago, page, redirect
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
    context["bundles"] = bundles.for_node(session, node=name, now=now)
    context["shared"] = shared_causes.memberships(session, name=name)
    context["ladder"] = ladder.view(session, name=name, now=now, settings=request.app.state.settings)
    window_s = request.app.state.settings.node_repeat_window_s
    context |= {
        "repeats": history.repeat_failures(session, name=name, now=now, window_s=window_s),
        "repeat_window_s": window_s,
    }
    # The incidents' summaries may name other machines' GPUs (a victim's page lists its culprit's incident).
    named = [name, *(n for i in v.incidents for n in i.named)]
    return page(request, "node.html", {**context, "gpus": gpus.for_nodes(session, named)})


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
        now = datetime.now(UTC)
        try:
            return nodes.return_to_service(
                session,
                name=name,
                reason=body.reason,
                diagnostics=body.diagnostics.model_dump(mode="json") if body.diagnostics else None,
                force=body.force,
                actor=viewer.actor,
                now=now,
                settings=settings,
            )
        except Conflict as exc:
            raise _in_page_terms(session, name=name, refusal=exc, now=now) from None

    return _act(request, name, "returned to service" + (" (forced)" if force else ""), run)


def _in_page_terms(session: Session, *, name: str, refusal: Conflict, now: datetime) -> Conflict:
    """A return refused for the quarantine or for want of diagnostics, said with this form's controls: the API's
    "pass force=true ... until 2026-11-28T17:58:05.140740+00:00" names a parameter the page does not have."""
    if "quarantined until" in refusal.message:
        until = nodes.get_by_name(session, name=name).quarantined_until
        if until is not None and until > now:
            until = until.astimezone(UTC)
            when = f"{until:%H:%M} UTC" if until.date() == now.date() else f"{until:%Y-%m-%d %H:%M} UTC"
            return Conflict(
                f"{name} is quarantined until {when} ({ago(until, now)}). Tick “force” to return it now (its "
                f"history records that), or wait until {when}."
            )
    if "diagnostics report" in refusal.message:
        return Conflict(
            f"{name} returns only with passing diagnostics: run them, tick “diagnostics passed” and paste the "
            "report under “diagnostics report” (or tick “force” to return it without)."
        )
    return refusal
