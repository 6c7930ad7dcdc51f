"""Decisions: the filtered list, and approve, reject and override from any page that shows one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from starlette.responses import Response

from service.db import session_scope
from service.decisions import lifecycle
from service.decisions import service as decisions
from service.decisions.schemas import DecisionOut, OverrideIn
from service.deps import DbSession
from service.errors import FaultlineError, InvalidInput
from service.models.diagnosis import DECISION_KINDS, DECISION_STATES
from service.params import Id
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import error_page, is_htmx, page, redirect
from service.ui.views import gpus
from service.ui.views import incident as incident_view
from service.validation import validated

router = APIRouter(include_in_schema=False)


@router.get("/decisions")
def decision_list(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    state: str = "",
    kind: str = "",
    job: str = "",
    node: str = "",
    cursor: str = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    # A typo in a hand-edited URL says so rather than showing an empty list that looks like calm.
    if state and state not in DECISION_STATES:
        raise InvalidInput(f"state: {state!r} is not one of {', '.join(DECISION_STATES)}")
    if kind and kind not in DECISION_KINDS:
        raise InvalidInput(f"kind: {kind!r} is not one of {', '.join(DECISION_KINDS)}")
    job, node = job.strip(), node.strip()
    params = {k: v for k, v in {"state": state, "kind": kind, "job": job, "node": node, "cursor": cursor}.items() if v}
    result = decisions.list_decisions(
        session,
        state=state or None,
        kind=kind or None,
        job=job or None,
        node=node or None,
        limit=limit,
        cursor=cursor or None,
        partial=True,
    )
    return page(
        request,
        "decisions.html",
        {
            "page": result,
            "params": params,
            "states": DECISION_STATES,
            "kinds": DECISION_KINDS,
            "gpus": gpus.for_nodes(session, [d.node for d in result.items]),
        },
    )


def _act(request: Request, return_to: str, action: Callable[..., DecisionOut], verb: str) -> Response:
    """Run one lifecycle step in its own transaction; htmx gets the decision's new card, a plain form a redirect."""
    choices = None
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            decision = action(session)
            names = gpus.for_nodes(session, [decision.node])
            # On an incident's page the card keeps its override form.
            if is_htmx(request) and decision.incident_id and return_to.startswith("/incidents/"):
                choices = incident_view.override_choices(session, incident_id=decision.incident_id)
    except FaultlineError as exc:
        if is_htmx(request):
            return error_page(request, exc)
        return redirect(request, return_to, flash=f"Not done: {exc.message}", refused=True)
    if is_htmx(request):
        context = {"d": decision, "return_to": return_to, "done": verb, "override_nodes": choices, "gpus": names}
        response = page(request, "_decision.html", context)
        # Parts of the page that summarize decisions (the incident's header, the overview's counts) listen for
        # this and re-read: after the swap, so the acted-on form is gone and the overview's refresh is not held.
        response.headers["HX-Trigger-After-Swap"] = "decision-changed"
        return response
    return redirect(
        request, return_to, flash=f"Decision {decision.id} {verb}: {decision.kind} is now {decision.state}."
    )


@router.post("/decisions/{decision_id}/approve")
def approve(request: Request, decision_id: Id, viewer: FormViewer, return_to: Annotated[str, Form()] = "/") -> Response:
    settings = request.app.state.settings
    return _act(
        request,
        return_to,
        lambda s: lifecycle.approve(
            s, decision_id=decision_id, actor=viewer.actor, now=datetime.now(UTC), settings=settings
        ),
        "approved",
    )


@router.post("/decisions/{decision_id}/reject")
def reject(
    request: Request,
    decision_id: Id,
    viewer: FormViewer,
    message: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "/",
) -> Response:
    settings = request.app.state.settings
    return _act(
        request,
        return_to,
        lambda s: lifecycle.reject(
            s,
            decision_id=decision_id,
            message=message.strip() or None,
            actor=viewer.actor,
            now=datetime.now(UTC),
            settings=settings,
        ),
        "rejected",
    )


@router.post("/decisions/{decision_id}/override")
def override(
    request: Request,
    decision_id: Id,
    viewer: FormViewer,
    kind: Annotated[str, Form()],
    message: Annotated[str, Form()],
    node: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "/",
) -> Response:
    settings = request.app.state.settings
    try:
        body = validated(OverrideIn, kind=kind, node=node.strip() or None, message=message.strip())
    except InvalidInput as error:
        if is_htmx(request):
            return error_page(request, error)
        return redirect(request, return_to, flash=error.message, refused=True)
    return _act(
        request,
        return_to,
        lambda s: lifecycle.override(
            s,
            decision_id=decision_id,
            kind=body.kind,
            node=body.node,
            message=body.message,
            actor=viewer.actor,
            now=datetime.now(UTC),
            settings=settings,
        ),
        "replaced the overridden one",
    )
