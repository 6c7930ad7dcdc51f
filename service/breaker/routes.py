"""The fleet circuit breaker: /api/v1/breaker."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from service.breaker import service
from service.breaker.schemas import BreakerOut, ResetIn
from service.deps import DbSession
from service.errors import ErrorBody
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/breaker", tags=["breaker"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]


@router.get("", response_model=BreakerOut)
def get_breaker(request: Request, session: DbSession, _: Reader) -> BreakerOut:
    """The breaker's state: closed, or tripped (when and why), what is out now against the limit, the decisions it
    holds for a person, and its audit trail of trips and resets."""
    return service.status(session, now=datetime.now(UTC), settings=request.app.state.settings)


@router.post(
    "/reset",
    response_model=BreakerOut,
    responses={
        403: {"model": ErrorBody, "description": "Not an operator or admin token: only a person resets the breaker"},
        409: {"model": ErrorBody, "description": "The breaker is not tripped"},
        422: {"model": ErrorBody, "description": "No reason, or a blank one"},
    },
)
def reset_breaker(body: ResetIn, request: Request, session: DbSession, principal: Operator) -> BreakerOut:
    """A person resumes automation, saying why (kept in the audit trail). Take-outs count afresh from now; the
    decisions the breaker held still wait for a person: approve or reject each."""
    return service.reset(
        session,
        reason=body.reason,
        actor=principal.actor,
        now=datetime.now(UTC),
        settings=request.app.state.settings,
    )
