"""Decisions for schedulers and people: /api/v1/decisions."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from service.db import session_scope
from service.decisions import lifecycle, service
from service.decisions.schemas import AckIn, DecisionOut, DecisionPage, OverrideIn, RejectIn
from service.deps import DbSession
from service.errors import ErrorBody
from service.models.diagnosis import DECISION_KINDS, DECISION_STATES
from service.params import BIGINT_MAX, Cursor, Id
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/decisions", tags=["decisions"])
Scheduler = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
State = Literal[DECISION_STATES]  # type: ignore[valid-type]
Kind = Literal[DECISION_KINDS]  # type: ignore[valid-type]

_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such decision"}}
_CONFLICT = {
    409: {
        "model": ErrorBody,
        "description": "The decision may not be acted on: expired, already acknowledged with another outcome, "
        "waiting for approval, or made in shadow mode. The message says which.",
        "content": {
            "application/json": {
                "example": {
                    "error": "conflict",
                    "message": "decision 12 expired at 2026-11-22T10:30:03+00:00 without acknowledgement; "
                    "do not act on it",
                }
            }
        },
    }
}


@router.get(
    "",
    response_model=DecisionPage,
    responses={422: {"model": ErrorBody, "description": "Unknown filter value or bad cursor"}},
)
async def list_decisions(
    request: Request,
    _: Scheduler,
    state: Annotated[State | None, Query(description="e.g. `pending`")] = None,
    kind: Annotated[
        list[Kind] | None, Query(description="e.g. `evict`; repeat for several: `kind=evict&kind=cordon`")
    ] = None,
    job: Annotated[
        str | None,
        Query(description="The job's external id (exact: a scheduler acts on what it lists)"),
    ] = None,
    node: Annotated[str | None, Query(description="Node name (exact)")] = None,
    after: Annotated[
        int | None, Query(ge=0, le=BIGINT_MAX, description="Only decisions with a greater id (newer)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=60,
            description="Long poll: when nothing matches, hold the request up to this many seconds and answer "
            "as soon as a matching decision exists (e.g. `wait=30`). 0 answers at once.",
        ),
    ] = 0,
) -> DecisionPage:
    """Decisions, newest first, with their evidence chain. A scheduler polls `state=pending&wait=30`."""
    factory = request.app.state.sessionmaker
    waiter = request.app.state.decision_waiter

    def read() -> DecisionPage:
        with session_scope(factory) as session:
            return service.list_decisions(
                session, state=state, kind=kind, job=job, node=node, after=after, limit=limit, cursor=cursor
            )

    deadline = time.monotonic() + min(wait, request.app.state.settings.decision_max_wait_s)
    while True:
        armed = waiter.arm() if wait else None
        page = await run_in_threadpool(read)
        left = deadline - time.monotonic()
        if page.items or armed is None or left <= 0 or await request.is_disconnected():
            return page
        await waiter.wait(armed, left)


@router.get("/{decision_id}", response_model=DecisionOut, responses=_NOT_FOUND)
def get_decision(decision_id: Id, session: DbSession, _: Scheduler) -> DecisionOut:
    """One decision with its evidence chain and outcome."""
    return service.get(session, decision_id=decision_id)


@router.post("/{decision_id}/ack", response_model=DecisionOut, responses={**_NOT_FOUND, **_CONFLICT})
def acknowledge_decision(
    decision_id: Id, ack: AckIn, request: Request, session: DbSession, principal: Scheduler
) -> DecisionOut:
    """Report what the scheduler did: `done`, `failed` or `rejected`, with a message.

    Acknowledging again with the same outcome is harmless and changes nothing.
    """
    return lifecycle.acknowledge(
        session,
        decision_id=decision_id,
        outcome=ack.outcome,
        message=ack.message,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )


@router.post("/{decision_id}/approve", response_model=DecisionOut, responses={**_NOT_FOUND, **_CONFLICT})
def approve_decision(decision_id: Id, request: Request, session: DbSession, principal: Operator) -> DecisionOut:
    """A person lets a decision that awaits approval go to the schedulers (it becomes `pending`)."""
    return lifecycle.approve(
        session,
        decision_id=decision_id,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )


@router.post("/{decision_id}/reject", response_model=DecisionOut, responses={**_NOT_FOUND, **_CONFLICT})
def reject_decision(
    decision_id: Id, body: RejectIn, request: Request, session: DbSession, principal: Operator
) -> DecisionOut:
    """A person overrules a pending or awaiting decision before a scheduler acts on it."""
    return lifecycle.reject(
        session,
        decision_id=decision_id,
        message=body.message,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )


@router.post(
    "/{decision_id}/override",
    response_model=DecisionOut,
    responses={**_NOT_FOUND, **_CONFLICT},
    status_code=201,
)
def override_decision(
    decision_id: Id, body: OverrideIn, request: Request, session: DbSession, principal: Operator
) -> DecisionOut:
    """Replace a pending decision with another action for its incident; answers the new decision.

    The old decision is rejected with a note naming its replacement.
    """
    return lifecycle.override(
        session,
        decision_id=decision_id,
        kind=body.kind,
        node=body.node,
        message=body.message,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )
