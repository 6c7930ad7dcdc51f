"""Chat channels and the webhook outbox: /api/v1/channels and /api/v1/deliveries."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status

from service.deps import DbSession
from service.notify import service
from service.notify.schemas import (
    ChannelIn,
    ChannelOut,
    ChannelPage,
    ChannelTestResult,
    ChannelUpdate,
    DeliveryOut,
    DeliveryPage,
    DeliveryState,
)
from service.params import Cursor, Id, id_query
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1")
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
_CHANNELS = ["channels"]
_DELIVERIES = ["deliveries"]


@router.post(
    "/channels",
    tags=_CHANNELS,
    status_code=status.HTTP_201_CREATED,
    response_model=ChannelOut,
    responses={
        409: {"description": "A channel with this name exists"},
        422: {"description": "Unknown kind, a URL that is not http(s), or a host not in the allow-list"},
    },
)
def create_channel(channel_in: ChannelIn, request: Request, session: DbSession, principal: Operator) -> ChannelOut:
    """Add a Slack, Lark or generic JSON webhook. Incident events go to every enabled channel."""
    return service.create_channel(
        session, channel_in=channel_in, principal=principal, settings=request.app.state.settings
    )


@router.get("/channels", tags=_CHANNELS, response_model=ChannelPage)
def list_channels(session: DbSession, _: Operator) -> ChannelPage:
    """Every channel, by name, with its waiting and failed deliveries counted. URLs are masked."""
    return service.list_channels(session)


@router.get(
    "/channels/{channel_id}",
    tags=_CHANNELS,
    response_model=ChannelOut,
    responses={404: {"description": "Unknown channel"}},
)
def get_channel(channel_id: Id, session: DbSession, _: Operator) -> ChannelOut:
    """One channel; its URL masked."""
    return service.get_channel(session, channel_id=channel_id)


@router.patch(
    "/channels/{channel_id}",
    tags=_CHANNELS,
    response_model=ChannelOut,
    responses={404: {"description": "Unknown channel"}, 422: {"description": "A bad URL or value"}},
)
def update_channel(
    channel_id: Id, channel_update: ChannelUpdate, request: Request, session: DbSession, _: Operator
) -> ChannelOut:
    """Enable or disable a channel, or change its URL, grouping window or rate limit."""
    return service.update_channel(
        session, channel_id=channel_id, channel_update=channel_update, settings=request.app.state.settings
    )


@router.delete(
    "/channels/{channel_id}",
    tags=_CHANNELS,
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"description": "Unknown channel"}},
)
def delete_channel(channel_id: Id, session: DbSession, _: Operator) -> None:
    """Remove a channel and its deliveries."""
    service.delete_channel(session, channel_id=channel_id)


@router.post(
    "/channels/{channel_id}/test",
    tags=_CHANNELS,
    response_model=ChannelTestResult,
    responses={404: {"description": "Unknown channel"}},
)
def test_channel(channel_id: Id, request: Request, session: DbSession, _: Operator) -> ChannelTestResult:
    """Post a test message now and say how the receiver answered (works on a disabled channel too)."""
    return service.send_test(session, channel_id=channel_id, settings=request.app.state.settings, now=datetime.now(UTC))


@router.get(
    "/deliveries",
    tags=_DELIVERIES,
    response_model=DeliveryPage,
    responses={422: {"description": "Unknown state or bad cursor"}},
)
def list_deliveries(
    session: DbSession,
    _: Operator,
    state: Annotated[DeliveryState | None, Query()] = None,
    channel: Annotated[int | None, id_query("A channel id")] = None,
    incident: Annotated[int | None, id_query("An incident id")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> DeliveryPage:
    """The outbox, newest first: each delivery's state, attempts, last error and next attempt."""
    return service.list_deliveries(
        session, state=state, channel_id=channel, incident_id=incident, limit=limit, cursor=cursor
    )


@router.post(
    "/deliveries/{delivery_id}/retry",
    tags=_DELIVERIES,
    response_model=DeliveryOut,
    responses={404: {"description": "Unknown delivery"}, 409: {"description": "Sent already, or being sent"}},
)
def retry_delivery(delivery_id: Id, session: DbSession, _: Operator) -> DeliveryOut:
    """Send a failed delivery again, with a fresh set of attempts. A pending one is returned unchanged."""
    return service.retry_delivery(session, delivery_id=delivery_id, now=datetime.now(UTC))
