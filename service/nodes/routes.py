"""Nodes for schedulers and people: /api/v1/nodes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request

from service.deps import DbSession
from service.errors import ErrorBody, InvalidInput
from service.models.nodes import NODE_STATES
from service.nodes import ladder, returns, service
from service.nodes.schemas import CordonIn, LadderOut, NodeDetail, NodePage, ReturnIn
from service.params import Cursor
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
State = Literal[NODE_STATES]  # type: ignore[valid-type]

_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such node"}}
_CONFLICT = {409: {"model": ErrorBody, "description": "The node's state does not allow it; the message says why."}}


@router.get("", response_model=NodePage, responses={422: {"model": ErrorBody, "description": "Bad filter or cursor"}})
def list_nodes(
    session: DbSession,
    _: Reader,
    state: Annotated[State | None, Query(description="e.g. `suspect`")] = None,
    lemon: Annotated[bool | None, Query(description="Only lemons (true) or only others (false)")] = None,
    name: Annotated[str | None, Query(description="A part of the node's name: `005` matches `node-005`")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    cursor: Cursor = None,
) -> NodePage:
    """Nodes with their state, filtered by state, lemon flag and a part of the name (as the web UI's list)."""
    return service.list_nodes(
        session, state=state, lemon=lemon, name=name.strip() if name else None, limit=limit, cursor=cursor
    )


@router.get("/{name}", response_model=NodeDetail, responses=_NOT_FOUND)
def get_node(name: str, session: DbSession, _: Reader) -> NodeDetail:
    """State, GPUs, the open incidents that accuse it, and its history across jobs."""
    return service.describe(session, name=name)


@router.get("/{name}/ladder", response_model=LadderOut, responses=_NOT_FOUND)
def get_node_ladder(name: str, request: Request, session: DbSession, _: Reader) -> LadderOut:
    """Its escalation ladder: each remedy (restart, GPU reset, reboot, repair, RMA), whether it held, the current
    rung, its RMA mark, and the thresholds in force."""
    return ladder.view(session, name=name, now=datetime.now(UTC), settings=request.app.state.settings)


@router.post("/{name}/cordon", response_model=NodeDetail, responses={**_NOT_FOUND, **_CONFLICT})
def cordon_node(name: str, body: CordonIn, request: Request, session: DbSession, principal: Operator) -> NodeDetail:
    """Take the node out of service by hand; schedulers receive a `cordon` decision. Cordoning again is harmless."""
    return service.cordon(
        session,
        name=name,
        reason=body.reason,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )


@router.post("/{name}/repair", response_model=NodeDetail, responses={**_NOT_FOUND, **_CONFLICT})
def repair_node(name: str, body: CordonIn, session: DbSession, principal: Operator) -> NodeDetail:
    """Record that the node went to repair."""
    return service.repair(session, name=name, reason=body.reason, actor=principal.actor, now=datetime.now(UTC))


@router.post(
    "/{name}/return",
    response_model=NodeDetail,
    responses={
        **_NOT_FOUND,
        **_CONFLICT,
        422: {"model": ErrorBody, "description": "Bad body, or a field a scheduler may not send (force, diagnostics)"},
    },
)
def return_node(name: str, body: ReturnIn, request: Request, session: DbSession, principal: Reader) -> NodeDetail:
    """Back to service. A person (operator): with passing diagnostics or `force` the node is healthy and schedulers
    receive a `return` decision; without, it is `returning` while its agent runs the stop-time checks, whose pass
    sends that decision. A node still in quarantine needs `force`. A scheduler (its adapter) reports a node
    it has put back in service: the node is `returning` and its checks run; 409 while a take-out decision for it
    waits on that scheduler."""
    now = datetime.now(UTC)
    if principal.scope == "scheduler":
        for field in ("force", "diagnostics"):
            if getattr(body, field):
                message = "a scheduler reports a return it made; only a person forces one or vouches with diagnostics"
                raise InvalidInput(f"{field}: {message}", details=[{"field": f"body.{field}", "message": message}])
        return returns.report_return(session, name=name, reason=body.reason, actor=principal.actor, now=now)
    return service.return_to_service(
        session,
        name=name,
        reason=body.reason,
        diagnostics=body.diagnostics.model_dump(mode="json") if body.diagnostics else None,
        force=body.force,
        actor=principal.actor,
        now=now,
        settings=request.app.state.settings,
    )
