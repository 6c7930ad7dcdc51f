"""Shared-cause incidents: /api/v1/shared-incidents."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from service.deps import DbSession
from service.errors import ErrorBody
from service.models.shared_causes import COMPONENT_KINDS, SHARED_INCIDENT_STATES
from service.params import Cursor, Id
from service.security import Principal, require_scope
from service.shared_causes import service
from service.shared_causes.schemas import ResolveIn, SharedIncidentDetail, SharedIncidentPage

router = APIRouter(prefix="/api/v1/shared-incidents", tags=["shared-incidents"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
State = Literal[SHARED_INCIDENT_STATES]  # type: ignore[valid-type]
Kind = Literal[COMPONENT_KINDS]  # type: ignore[valid-type]


@router.get(
    "", response_model=SharedIncidentPage, responses={422: {"description": "Unknown filter value or bad cursor"}}
)
def list_shared_incidents(
    session: DbSession,
    _: Reader,
    state: Annotated[State | None, Query(description="open or resolved")] = None,
    component_kind: Annotated[Kind | None, Query(description="e.g. `switch`, `driver`, `storage`")] = None,
    node: Annotated[str | None, Query(description="A part of the name of a member node")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> SharedIncidentPage:
    """Shared-cause incidents, newest first: one component (a leaf switch, a rack, a driver version, a storage
    mount...) blamed for findings on several nodes at once, its members cordoned from new work."""
    return service.list_incidents(
        session, state=state, component_kind=component_kind, node=node, limit=limit, cursor=cursor
    )


@router.get(
    "/{incident_id}",
    response_model=SharedIncidentDetail,
    responses={404: {"model": ErrorBody, "description": "Unknown shared incident"}},
)
def get_shared_incident(incident_id: Id, session: DbSession, _: Reader) -> SharedIncidentDetail:
    """One shared incident: the component, its members (with when each joined), the evidence, and its cordons."""
    return service.get(session, incident_id=incident_id)


@router.post(
    "/{incident_id}/resolve",
    response_model=SharedIncidentDetail,
    responses={
        404: {"model": ErrorBody, "description": "Unknown shared incident"},
        422: {"model": ErrorBody, "description": "No reason, or an unknown field"},
    },
)
def resolve_shared_incident(
    incident_id: Id, body: ResolveIn, session: DbSession, principal: Operator
) -> SharedIncidentDetail:
    """A person says the component is repaired: the incident resolves (resolving it again changes nothing). Its
    members stay cordoned until returned to service (POST /api/v1/nodes/{name}/return), through their return gate."""
    service.resolve_by_hand(
        session, incident_id=incident_id, reason=body.reason, actor=principal.actor, now=datetime.now(UTC)
    )
    return service.get(session, incident_id=incident_id)
