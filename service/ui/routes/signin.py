"""Sign in with an operator token; sign out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from service.db import session_scope
from service.errors import Forbidden, Unauthenticated
from service.ui import sessions
from service.ui.auth import COOKIE, FormViewer
from service.ui.render import page, redirect, safe_next

router = APIRouter(include_in_schema=False)


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    return page(request, "login.html", {"next": safe_next(next)})


@router.post("/login")
async def login(request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/") -> Response:
    settings = request.app.state.settings

    def open_session() -> str:
        with session_scope(request.app.state.sessionmaker) as session:
            return sessions.sign_in(session, token=token, now=datetime.now(UTC), hours=settings.ui_session_hours).key

    try:
        key = await run_in_threadpool(open_session)
    except (Unauthenticated, Forbidden) as exc:
        return page(request, "login.html", {"next": safe_next(next), "error": exc.message}, status_code=exc.status_code)
    request.state.new_session_key = key
    return redirect(request, safe_next(next))


@router.post("/logout")
def logout(request: Request, _: FormViewer) -> Response:
    key = request.cookies.get(COOKIE)
    if key:
        with session_scope(request.app.state.sessionmaker) as session:
            sessions.sign_out(session, key=key)
    response = redirect(request, "/login", flash="Signed out.")
    response.delete_cookie(COOKIE, path="/")
    return response
