"""Who is looking at a page: a session cookie, or a user an authenticating proxy vouched for; CSRF checks."""

from __future__ import annotations

import hmac
import ipaddress
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from service.breaker import service as breaker
from service.config import Settings
from service.db import session_scope
from service.errors import FaultlineError, Forbidden
from service.shared_causes import service as shared_causes
from service.ui import sessions
from service.ui.sessions import Viewer

COOKIE = "faultline_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


class SignInRequired(FaultlineError):
    """Not signed in: pages send the browser to the sign-in page (htmx requests get an HX-Redirect)."""

    status_code = 401
    code = "unauthenticated"

    def __init__(self, next_path: str) -> None:
        super().__init__("sign in to see this page")
        self.location = f"/login?next={quote(next_path, safe='/')}"


def _from_trusted_proxy(request: Request, settings: Settings) -> bool:
    if request.client is None:
        return False
    try:
        address = ipaddress.ip_address(request.client.host)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in settings.ui_trusted_proxies)


def _proxied_user(request: Request, settings: Settings) -> str | None:
    """The user an authenticating proxy put in its header, if the UI trusts that header from this peer."""
    if not settings.ui_trusted_user_header:
        return None
    user = request.headers.get(settings.ui_trusted_user_header, "").strip()
    if not user or not _from_trusted_proxy(request, settings):
        return None
    return user[:200]


def _resolve(request: Request) -> Viewer | None:
    settings: Settings = request.app.state.settings
    key = request.cookies.get(COOKIE)
    proxied = _proxied_user(request, settings)
    now = datetime.now(UTC)
    with session_scope(request.app.state.sessionmaker) as session:
        # Every page shows a tripped fleet breaker and the open shared causes (base.html's banners): read with the
        # viewer, in one session.
        request.state.breaker = breaker.tripped(session)
        request.state.shared_open = shared_causes.open_banner(session)
        viewer = sessions.lookup(session, key=key, now=now) if key else None
        if proxied is None or (viewer is not None and viewer.name == proxied and viewer.via_proxy):
            return viewer
        # The proxy speaks for someone else (or no one had signed in): a session of its own, for the CSRF token.
        scope = "admin" if proxied in settings.ui_proxy_admins else settings.ui_proxy_scope
        new = sessions.sign_in_proxied(session, user=proxied, scope=scope, now=now, hours=settings.ui_session_hours)
        request.state.new_session_key = new.key
        return new.viewer


async def current_viewer(request: Request) -> Viewer:
    viewer = await run_in_threadpool(_resolve, request)
    if viewer is None:
        raise SignInRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    request.state.viewer = viewer
    return viewer


async def admin_viewer(viewer: Annotated[Viewer, Depends(current_viewer)]) -> Viewer:
    if not viewer.is_admin:
        raise Forbidden("this page is for admins: sign in with an admin token")
    return viewer


async def checked_viewer(request: Request, viewer: Annotated[Viewer, Depends(current_viewer)]) -> Viewer:
    """The viewer of a form post, which must carry the session's CSRF token (a field, or htmx's header)."""
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.form()
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if not sent or not hmac.compare_digest(sent, viewer.csrf_token):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and try again")
    return viewer


def set_session_cookie(request: Request, response: object, key: str) -> None:
    """The session cookie: not readable by scripts, not sent by other sites' forms, HTTPS-only behind HTTPS."""
    settings: Settings = request.app.state.settings
    response.set_cookie(  # type: ignore[attr-defined]
        COOKIE,
        key,
        max_age=int(settings.ui_session_hours * 3600),
        httponly=True,
        samesite="lax",
        secure=settings.public_url.startswith("https://"),
        path="/",
    )


ViewerDep = Annotated[Viewer, Depends(current_viewer)]
AdminDep = Annotated[Viewer, Depends(admin_viewer)]
FormViewer = Annotated[Viewer, Depends(checked_viewer)]
