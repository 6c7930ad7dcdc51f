"""Decisions for schedulers and people: /api/v1/decisions."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from service.decisions import service
from service.decisions.schemas import DecisionPage
from service.deps import DbSession
from service.models.diagnosis import DECISION_KINDS, DECISION_STATES
from service.security import require_scope
from service.tokens.service import Principal

router = APIRouter(prefix="/api/v1/decisions", tags=["decisions"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
State = Literal[DECISION_STATES]  # type: ignore[valid-type]
Kind = Literal[DECISION_KINDS]  # type: ignore[valid-type]


@router.get("", response_model=DecisionPage, responses={422: {"description": "Unknown filter value or bad cursor"}})
def list_decisions(
    session: DbSession,
    _: Reader,
    state: Annotated[State | None, Query(description="e.g. `pending`")] = None,
    kind: Annotated[Kind | None, Query(description="e.g. `evict`")] = None,
    job: Annotated[str | None, Query(description="The job's external id")] = None,
    node: Annotated[str | None, Query(description="Node name")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
) -> DecisionPage:
    """Decisions, newest first, with their evidence chain."""
    return service.list_decisions(session, state=state, kind=kind, job=job, node=node, limit=limit, cursor=cursor)
