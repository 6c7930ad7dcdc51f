"""Planned maintenance windows: /api/v1/nodes/{name}/maintenance and /api/v1/maintenance."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from service.deps import DbSession
from service.errors import ErrorBody, Forbidden
from service.params import Cursor, Id
from service.planned import service
from service.planned.schemas import CloudEventsIn, CloudEventsOut, WindowIn, WindowOut, WindowPage
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1", tags=["maintenance"])
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Agent = Annotated[Principal, Depends(require_scope("agent"))]

_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such node (or window)"}}


@router.post(
    "/nodes/{name}/maintenance",
    status_code=status.HTTP_201_CREATED,
    response_model=WindowOut,
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorBody, "description": "It overlaps a window of the node announced already"},
        422: {"model": ErrorBody, "description": "A window in the past, or one that ends before it starts"},
    },
)
def announce_maintenance(name: str, body: WindowIn, session: DbSession, principal: Operator) -> WindowOut:
    """Announce a node's maintenance window. `FAULTLINE_MAINTENANCE_LEAD_S` before it starts the node's job is asked
    to checkpoint and the node drained (a `cordon` decision); while it lasts the node's going down is no fault; after
    it, the node returns through its return gate."""
    return service.announce(session, name=name, window_in=body, actor=principal.actor, now=datetime.now(UTC))


@router.get("/nodes/{name}/maintenance", response_model=WindowPage, responses=_NOT_FOUND)
def list_node_maintenance(
    name: str,
    session: DbSession,
    _: Reader,
    current: Annotated[bool, Query(description="Only windows not over nor cancelled")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
) -> WindowPage:
    """The node's maintenance windows, newest first."""
    return service.list_windows(session, name=name, current=current, limit=limit, cursor=cursor, now=datetime.now(UTC))


@router.get("/maintenance", response_model=WindowPage)
def list_maintenance(
    session: DbSession,
    _: Reader,
    current: Annotated[bool, Query(description="Only windows not over nor cancelled")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
) -> WindowPage:
    """Every node's maintenance windows, newest first."""
    return service.list_windows(session, name=None, current=current, limit=limit, cursor=cursor, now=datetime.now(UTC))


@router.delete("/nodes/{name}/maintenance/{window_id}", response_model=WindowOut, responses=_NOT_FOUND)
def cancel_maintenance(name: str, window_id: Id, session: DbSession, principal: Operator) -> WindowOut:
    """Cancel a window (idempotent). One already acted on ends its silence, and the node it drained goes back through
    its return gate."""
    return service.cancel(session, name=name, window_id=window_id, actor=principal.actor, now=datetime.now(UTC))


@router.put(
    "/nodes/{name}/maintenance/cloud",
    response_model=CloudEventsOut,
    responses={**_NOT_FOUND, 403: {"model": ErrorBody, "description": "A token bound to another node"}},
)
def report_cloud_events(name: str, body: CloudEventsIn, session: DbSession, principal: Agent) -> CloudEventsOut:
    """The node's agent reports the scheduled events its cloud's metadata service lists now (all of them): each is a
    window with source `cloud:<provider>`; one the cloud no longer lists, not started yet, is cancelled."""
    if principal.node_name is not None and principal.node_name != name:
        raise Forbidden(f"this token may only report events of node {principal.node_name!r}, not {name!r}")
    windows, cancelled = service.report_cloud(
        session, name=name, provider=body.provider, events=body.events, now=datetime.now(UTC)
    )
    return CloudEventsOut(windows=windows, cancelled=cancelled)
