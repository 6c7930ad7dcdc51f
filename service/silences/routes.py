"""Silences: /api/v1/silences."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from service.deps import DbSession
from service.params import Cursor, Id
from service.security import Principal, require_scope
from service.silences import service
from service.silences.schemas import SilenceIn, SilenceOut, SilencePage, SilenceState

router = APIRouter(prefix="/api/v1/silences", tags=["silences"])
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SilenceOut,
    responses={
        422: {"description": "No pattern, a bad pattern, or a window that ends before it starts or in the past"}
    },
)
def create_silence(silence_in: SilenceIn, session: DbSession, principal: Operator) -> SilenceOut:
    """Silence matching nodes and/or jobs for a window: incidents are still recorded but decide and alert nothing."""
    now = datetime.now(UTC)
    return service.to_out(service.create(session, silence_in=silence_in, principal=principal, now=now), now=now)


@router.get("", response_model=SilencePage, responses={422: {"description": "Unknown state or bad cursor"}})
def list_silences(
    session: DbSession,
    _: Reader,
    state: Annotated[SilenceState | None, Query(description="active, pending (starts later) or expired")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
) -> SilencePage:
    """Silences, newest first."""
    return service.list_silences(session, state=state, limit=limit, cursor=cursor, now=datetime.now(UTC))


@router.get("/{silence_id}", response_model=SilenceOut, responses={404: {"description": "Unknown silence"}})
def get_silence(silence_id: Id, session: DbSession, _: Reader) -> SilenceOut:
    """One silence with its state."""
    return service.to_out(service.get(session, silence_id=silence_id), now=datetime.now(UTC))


@router.delete("/{silence_id}", response_model=SilenceOut, responses={404: {"description": "Unknown silence"}})
def expire_silence(silence_id: Id, session: DbSession, _: Operator) -> SilenceOut:
    """End a silence now (idempotent). The record stays, with `expired_at` set."""
    now = datetime.now(UTC)
    return service.to_out(service.expire(session, silence_id=silence_id, now=now), now=now)
