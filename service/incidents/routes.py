"""Incidents: /api/v1/incidents."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request

from ml.findings import CATEGORIES
from service.deps import DbSession
from service.errors import ErrorBody
from service.incidents import service
from service.incidents.schemas import AcknowledgeIn, IncidentOut, IncidentPage, ResolveIn
from service.models.diagnosis import INCIDENT_STATES
from service.params import Cursor, Id
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/incidents", tags=["incidents"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
State = Literal[(*INCIDENT_STATES, "unresolved")]  # type: ignore[valid-type]
Severity = Literal["critical", "major", "minor"]
RootCause = Literal[CATEGORIES]  # type: ignore[valid-type]


@router.get("", response_model=IncidentPage, responses={422: {"description": "Unknown filter value or bad cursor"}})
def list_incidents(
    session: DbSession,
    _: Reader,
    job: Annotated[str | None, Query(description="A part of the job's external id: `demo` matches `demo-job`")] = None,
    node: Annotated[
        str | None, Query(description="A part of the name of a machine it is about (its anchor or a suspect)")
    ] = None,
    state: Annotated[State | None, Query(description="`unresolved`: open or mitigating")] = None,
    severity: Annotated[Severity | None, Query()] = None,
    root_cause: Annotated[RootCause | None, Query(description="e.g. `gpu_hardware`, `network`, `hang`")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> IncidentPage:
    """Incidents, newest first (without their findings: open one for those). Name filters match a part of the
    name, case-insensitively, as on every list of the API and the web UI; an unknown state, severity or root
    cause is a 422 naming the values it may take."""
    return service.list_incidents(
        session,
        job=job,
        node=node,
        state=state,
        severity=severity,
        root_cause=root_cause,
        limit=limit,
        cursor=cursor,
    )


@router.get("/{incident_id}", response_model=IncidentOut, responses={404: {"description": "Unknown incident"}})
def get_incident(incident_id: Id, session: DbSession, _: Reader) -> IncidentOut:
    """One incident: root cause, blame, ranked suspects, its findings with evidence, and its decisions."""
    return service.get(session, incident_id=incident_id)


@router.post(
    "/{incident_id}/resolve",
    response_model=IncidentOut,
    responses={
        404: {"model": ErrorBody, "description": "Unknown incident"},
        409: {"model": ErrorBody, "description": "Already resolved: the message says when and why"},
        422: {"model": ErrorBody, "description": "No reason, or an unknown field"},
    },
)
def resolve_incident(
    incident_id: Id, body: ResolveIn, request: Request, session: DbSession, principal: Operator
) -> IncidentOut:
    """A person closes an incident with a reason, kept with their name and the time (`resolved_by`,
    `resolved_at`, `resolution`). Decisions of it still waiting on anyone are rejected in their name."""
    return service.resolve_by_hand(
        session,
        incident_id=incident_id,
        reason=body.reason,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )


@router.post(
    "/{incident_id}/acknowledge",
    response_model=IncidentOut,
    responses={
        404: {"model": ErrorBody, "description": "Unknown incident"},
        409: {"model": ErrorBody, "description": "Already resolved: nothing left to be on"},
        422: {"model": ErrorBody, "description": "A note over 400 characters, or an unknown field"},
    },
)
def acknowledge_incident(
    incident_id: Id, session: DbSession, principal: Operator, body: AcknowledgeIn | None = None
) -> IncidentOut:
    """A person says "I'm on it" (`acknowledged_by`, `acknowledged_at`, and every acknowledgement in
    `acknowledgements`), with an optional note. The incident's state and decisions stay as they are; acknowledging
    again changes nothing, and another person's acknowledgement takes it over (both stay in the record)."""
    return service.acknowledge(
        session,
        incident_id=incident_id,
        actor=principal.actor,
        note=body.note if body else None,
        now=datetime.now(UTC),
    )
