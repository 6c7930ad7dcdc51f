"""Silences: the list by state, a form that opens one, and a button that ends one early."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.db import session_scope
from service.deps import DbSession
from service.errors import FaultlineError, InvalidInput
from service.params import Id
from service.silences import service as silences
from service.silences.schemas import SILENCE_STATES, SilenceIn, SilenceState
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import page, redirect, timestamp
from service.ui.views import admin
from service.validation import validated

router = APIRouter(include_in_schema=False)
PAGE_SIZE = 50
# What the create form starts with, and shows again (as typed) when it is refused.
BLANK_FORM = {"node_pattern": "", "job_pattern": "", "duration": "", "unit": "hours", "ends_at": "", "comment": ""}


def _render(
    request: Request,
    session: Session,
    *,
    state: str = "",
    cursor: str = "",
    form: dict[str, str] | None = None,
    error: FaultlineError | None = None,
    status_code: int = 200,
) -> Response:
    if state and state not in SILENCE_STATES:
        raise InvalidInput(f"state: {state!r} is not one of {', '.join(SILENCE_STATES)}")
    now = datetime.now(UTC)
    chosen: SilenceState | None = state or None  # type: ignore[assignment]
    result = silences.list_silences(session, state=chosen, limit=PAGE_SIZE, cursor=cursor or None, now=now)
    params = {k: v for k, v in {"state": state, "cursor": cursor}.items() if v}
    context: dict[str, Any] = {
        "page": result,
        "params": params,
        "states": SILENCE_STATES,
        "units": admin.DURATION_UNITS,
        "form": form or BLANK_FORM,
        "errors": admin.error_lines(error) if error else [],
        # Where the expire buttons come back to: this list, with its filters.
        "return_to": "/silences" + (f"?{urlencode(params)}" if params else ""),
    }
    return page(request, "silences.html", context, status_code=status_code)


@router.get("/silences")
def silence_list(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    state: str = "",
    cursor: Annotated[str, Query()] = "",
) -> Response:
    return _render(request, session, state=state, cursor=cursor)


def _silence_in(form: dict[str, str], *, author: str) -> SilenceIn:
    """The API's schema over the form's fields: the same rules, the same messages."""
    duration = admin.duration_s(form["duration"], form["unit"])
    ends_at = admin.utc_time(form["ends_at"], field="ends_at")
    return validated(
        SilenceIn,
        node_pattern=form["node_pattern"].strip() or None,
        job_pattern=form["job_pattern"].strip() or None,
        duration_s=duration,
        ends_at=ends_at,
        author=author[:200],
        comment=form["comment"].strip(),
    )


@router.post("/silences")
def create_silence(
    request: Request,
    viewer: FormViewer,
    node_pattern: Annotated[str, Form()] = "",
    job_pattern: Annotated[str, Form()] = "",
    duration: Annotated[str, Form()] = "",
    unit: Annotated[str, Form()] = "hours",
    ends_at: Annotated[str, Form()] = "",
    comment: Annotated[str, Form()] = "",
) -> Response:
    form = {
        "node_pattern": node_pattern,
        "job_pattern": job_pattern,
        "duration": duration,
        "unit": unit,
        "ends_at": ends_at,
        "comment": comment,
    }
    now = datetime.now(UTC)
    try:
        silence_in = _silence_in(form, author=viewer.name)
        with session_scope(request.app.state.sessionmaker) as session:
            created = silences.to_out(
                silences.create(session, silence_in=silence_in, principal=admin.principal(viewer), now=now), now=now
            )
    except FaultlineError as exc:
        with session_scope(request.app.state.sessionmaker) as session:
            return _render(request, session, form=form, error=exc, status_code=exc.status_code)
    what = " and ".join(
        f"{label} {pattern}"
        for label, pattern in (("nodes", created.node_pattern), ("jobs", created.job_pattern))
        if pattern
    )
    return redirect(
        request,
        "/silences",
        flash=f"Silence #{created.id} ({created.state}) mutes {what} until {timestamp(created.ends_at)}.",
    )


@router.post("/silences/{silence_id}/expire")
def expire_silence(
    request: Request, silence_id: Id, _: FormViewer, return_to: Annotated[str, Form()] = "/silences"
) -> Response:
    now = datetime.now(UTC)
    try:
        with session_scope(request.app.state.sessionmaker) as session:
            ended = silences.to_out(silences.expire(session, silence_id=silence_id, now=now), now=now)
    except FaultlineError as exc:
        with session_scope(request.app.state.sessionmaker) as session:
            return _render(request, session, error=exc, status_code=exc.status_code)
    return redirect(request, return_to, flash=f"Silence #{ended.id} ended: it mutes nothing from now on.")
