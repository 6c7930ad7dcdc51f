"""Templates and the responses pages and forms send: full pages, htmx fragments, redirects with a flash."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from fastapi import Request
from fastapi.templating import Jinja2Templates
from starlette.responses import RedirectResponse, Response

from ml.quantities import significant
from service.errors import FaultlineError
from service.ui import formatting
from service.ui.auth import CSRF_FIELD, SignInRequired, set_session_cookie

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
FLASH_COOKIE = "faultline_flash"

templates = Jinja2Templates(directory=HERE / "templates")


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """'12 s ago', '5 min ago', '3 h ago', '2 d ago': what an on-call engineer reads at a glance."""
    if value is None:
        return "never"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 36 * 3600:
        text = f"{seconds / 3600:.0f} h"
    else:
        text = f"{seconds / 86400:.0f} d"
    return f"in {text}" if future else f"{text} ago"


def timestamp(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def duration_fine(seconds: float | None) -> str:
    """A short span with its fraction: 0.42 s, 1.5 s, then as `duration`."""
    if seconds is None:
        return "—"
    return f"{significant(seconds, 3)} s" if seconds < 10 else duration(seconds)


def dict_with(params: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**params, **changes}


def dict_without(params: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in keys}


templates.env.filters.update(
    ago=ago,
    timestamp=timestamp,
    duration=duration,
    duration_fine=duration_fine,
    percent=formatting.percent,
    number=formatting.number,
    dict_with=dict_with,
    dict_without=dict_without,
)
templates.env.globals.update(CSRF_FIELD=CSRF_FIELD)


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def _finish(request: Request, response: Response) -> Response:
    key = getattr(request.state, "new_session_key", None)
    if key:
        set_session_cookie(request, response, key)
    return response


def page(request: Request, template: str, context: dict[str, Any], *, status_code: int = 200) -> Response:
    """A page (or an htmx fragment) with the viewer, their CSRF token and a flash message left by the last form."""
    flash = unquote(request.cookies.get(FLASH_COOKIE) or "")
    response = templates.TemplateResponse(
        request,
        template,
        {
            "viewer": getattr(request.state, "viewer", None),
            "breaker": getattr(request.state, "breaker", None),
            "shared_open": getattr(request.state, "shared_open", None),
            "flash": flash.removeprefix("!") or None,
            "flash_refused": flash.startswith("!"),
            "now": datetime.now(UTC),
            "path": request.url.path,
            **context,
        },
        status_code=status_code,
    )
    if flash:
        response.delete_cookie(FLASH_COOKIE, path="/")
    return _finish(request, response)


def redirect(request: Request, url: str, *, flash: str | None = None, refused: bool = False) -> Response:
    """After a form: back to a page (303, so a reload does not post again), with a one-time message;
    `refused` shows it as an error (nothing was done)."""
    response = RedirectResponse(safe_next(url), status_code=303)
    if flash:
        value = quote(("!" if refused else "") + flash[:300])
        response.set_cookie(FLASH_COOKIE, value, max_age=60, httponly=True, samesite="lax", path="/")
    return _finish(request, response)


def safe_next(url: str | None, default: str = "/") -> str:
    """Only paths on this site: a `next=https://evil.example` after sign-in goes home instead."""
    if not url or not url.startswith("/") or url.startswith("//") or "\\" in url:
        return default
    return url


def is_ui_request(request: Request) -> bool:
    path = request.url.path
    return not (path.startswith("/api/") or path in ("/healthz", "/metrics", "/openapi.json"))


def error_page(request: Request, exc: FaultlineError) -> Response:
    """A UI request's error as a page (or, for htmx, a fragment it can show) rather than JSON."""
    if isinstance(exc, SignInRequired):
        if is_htmx(request):
            return Response(status_code=401, headers={"HX-Redirect": exc.location})
        return RedirectResponse(exc.location, status_code=303)
    template = "_error_fragment.html" if is_htmx(request) else "error.html"
    return page(request, template, {"error": exc}, status_code=exc.status_code)
