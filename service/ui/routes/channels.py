"""Chat channels: the list (URLs masked, as the API shows them), add, enable or disable, delete, send a test;
and the deliveries that gave up, with a retry button."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.db import session_scope
from service.deps import DbSession
from service.errors import FaultlineError
from service.models.notify import CHANNEL_KINDS
from service.notify import service as notify
from service.notify.schemas import ChannelIn, ChannelUpdate
from service.params import Id, id_query
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import page, redirect
from service.ui.views import admin
from service.validation import validated

router = APIRouter(include_in_schema=False)
FAILED_PAGE_SIZE = 20
# The URL is never put back in the form: it is a secret, and a refused one should be typed again anyway.
BLANK_FORM = {"name": "", "kind": "slack", "group_wait_s": "", "rate_limit_per_minute": "", "enabled": "on"}


def _render(
    request: Request,
    session: Session,
    *,
    channel: int | None = None,
    cursor: str = "",
    form: dict[str, str] | None = None,
    error: FaultlineError | None = None,
    action_error: FaultlineError | None = None,
    status_code: int = 200,
) -> Response:
    channels = notify.list_channels(session).items
    failed = notify.list_deliveries(
        session, state="failed", channel_id=channel, incident_id=None, limit=FAILED_PAGE_SIZE, cursor=cursor or None
    )
    params: dict[str, Any] = {k: v for k, v in {"channel": channel, "cursor": cursor}.items() if v}
    context: dict[str, Any] = {
        "channels": channels,
        "failed": failed,
        "params": params,
        "filtered": next((c for c in channels if c.id == channel), None),
        "kinds": CHANNEL_KINDS,
        "form": form or BLANK_FORM,
        "errors": admin.error_lines(error) if error else [],
        "action_errors": admin.error_lines(action_error) if action_error else [],
        "return_to": "/channels" + (f"?{urlencode(params)}" if params else ""),
    }
    return page(request, "channels.html", context, status_code=status_code)


@router.get("/channels")
def channel_list(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    channel: Annotated[int | None, id_query("Failed deliveries of this channel only")] = None,
    cursor: str = "",
) -> Response:
    return _render(request, session, channel=channel, cursor=cursor)


def _refused(request: Request, exc: FaultlineError) -> Response:
    """A button whose action was refused: the page again, the reason at the top, the error's status."""
    with session_scope(request.app.state.sessionmaker) as session:
        return _render(request, session, action_error=exc, status_code=exc.status_code)


@router.post("/channels")
def create_channel(
    request: Request,
    viewer: FormViewer,
    name: Annotated[str, Form()] = "",
    kind: Annotated[str, Form()] = "",
    url: Annotated[str, Form()] = "",
    group_wait_s: Annotated[str, Form()] = "",
    rate_limit_per_minute: Annotated[str, Form()] = "",
    enabled: Annotated[str, Form()] = "",
) -> Response:
    form = {
        "name": name,
        "kind": kind,
        "group_wait_s": group_wait_s,
        "rate_limit_per_minute": rate_limit_per_minute,
        "enabled": enabled,
    }
    # Blank number fields take the API's defaults; pydantic parses (and refuses) the rest as the API would.
    numbers = {
        k: v.strip() for k, v in (("group_wait_s", group_wait_s), ("rate_limit_per_minute", rate_limit_per_minute))
    }
    try:
        channel_in = validated(
            ChannelIn,
            name=name.strip(),
            kind=kind,
            url=url.strip(),
            enabled=bool(enabled),
            **{k: v for k, v in numbers.items() if v},
        )
        with session_scope(request.app.state.sessionmaker) as session:
            created = notify.create_channel(
                session, channel_in=channel_in, principal=admin.principal(viewer), settings=request.app.state.settings
            )
    except FaultlineError as exc:
        with session_scope(request.app.state.sessionmaker) as session:
            return _render(request, session, form=form, error=exc, status_code=exc.status_code)
    state = "enabled" if created.enabled else "disabled"
    return redirect(
        request, "/channels", flash=f"Channel {created.name} ({created.kind}, {state}) added: {created.url}"
    )


@router.post("/channels/{channel_id}/enabled")
def set_enabled(
    request: Request,
    channel_id: Id,
    _: FormViewer,
    enabled: Annotated[str, Form()],
    return_to: Annotated[str, Form()] = "/channels",
) -> Response:
    on = enabled == "true"
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            channel = notify.update_channel(
                session,
                channel_id=channel_id,
                channel_update=ChannelUpdate(enabled=on),
                settings=request.app.state.settings,
            )
    except FaultlineError as exc:
        return _refused(request, exc)
    return redirect(request, return_to, flash=f"Channel {channel.name} {'enabled' if on else 'disabled'}.")


@router.post("/channels/{channel_id}/delete")
def delete_channel(
    request: Request, channel_id: Id, _: FormViewer, return_to: Annotated[str, Form()] = "/channels"
) -> Response:
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            name = notify.get_channel(session, channel_id=channel_id).name
            notify.delete_channel(session, channel_id=channel_id)
    except FaultlineError as exc:
        return _refused(request, exc)
    # The failed-deliveries filter may name the deleted channel: back to the plain list.
    return redirect(request, "/channels", flash=f"Channel {name} deleted, with its deliveries.")


@router.post("/channels/{channel_id}/test")
def send_test(
    request: Request, channel_id: Id, _: FormViewer, return_to: Annotated[str, Form()] = "/channels"
) -> Response:
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            name = notify.get_channel(session, channel_id=channel_id).name
            result = notify.send_test(
                session, channel_id=channel_id, settings=request.app.state.settings, now=datetime.now(UTC)
            )
    except FaultlineError as exc:
        return _refused(request, exc)
    if result.delivered:
        flash = f"Test message sent to {name}: the receiver answered HTTP {result.status_code}."
    else:
        flash = f"Test message to {name} failed: {result.error or f'HTTP {result.status_code}'}."
    return redirect(request, return_to, flash=flash)


@router.post("/channels/deliveries/{delivery_id}/retry")
def retry_delivery(
    request: Request, delivery_id: Id, _: FormViewer, return_to: Annotated[str, Form()] = "/channels"
) -> Response:
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            delivery = notify.retry_delivery(session, delivery_id=delivery_id, now=datetime.now(UTC))
    except FaultlineError as exc:
        return _refused(request, exc)
    return redirect(
        request,
        return_to,
        flash=f"Delivery {delivery.id} to {delivery.channel} is {delivery.state}: it goes out again.",
    )
