"""Alertmanager's webhook receiver: POST /api/v1/alertmanager."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from service.alerts import service
from service.alerts.schemas import AlertmanagerPayload, AlertsResult
from service.deps import DbSession
from service.errors import ErrorBody
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/alertmanager", tags=["alerts"])
Poster = Annotated[Principal, Depends(require_scope("agent", "operator", "admin"))]


@router.post(
    "",
    response_model=AlertsResult,
    responses={
        401: {"model": ErrorBody, "description": "Missing, unknown, revoked or expired token"},
        403: {"model": ErrorBody, "description": "Wrong scope, or an agent token bound to another node"},
        422: {"model": ErrorBody, "description": "Not an Alertmanager version 4 payload; nothing was stored"},
        503: {"model": ErrorBody, "description": "Database unavailable: Alertmanager retries"},
    },
)
def receive_alerts(
    payload: AlertmanagerPayload, request: Request, session: DbSession, principal: Poster
) -> AlertsResult:
    """Store a notification's alerts as signals; firing critical ones diagnose their node's job at once."""
    return service.store_alerts(
        session,
        payload=payload,
        principal=principal,
        now=datetime.now(UTC),
        on_urgent=request.app.state.diagnosis_trigger.fire,
    )
