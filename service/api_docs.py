"""/redoc with nothing fetched from the internet. fastapi-offline ships ReDoc's file, but ReDoc's sidebar badge
("API docs by Redocly") loads its logo from ReDoc's CDN: this serves the same packaged file with that one
address replaced by an empty inline image, so an offline browser makes no failed request."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html
from starlette.responses import HTMLResponse, Response

REDOC_JS = Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js"
JS_PATH = "/api-docs/redoc.standalone.js"
BADGE_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
_EMPTY_IMAGE = "data:image/svg+xml,%3Csvg%20xmlns=%27http://www.w3.org/2000/svg%27/%3E"

router = APIRouter(include_in_schema=False)


@cache
def redoc_js() -> bytes:
    """The packaged ReDoc with its badge's logo inline; read once (about 1 MB)."""
    return REDOC_JS.read_text(encoding="utf-8").replace(BADGE_LOGO, _EMPTY_IMAGE).encode()


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{JS_PATH}",
        redoc_favicon_url=f"{root}/static/favicon.svg",
        with_google_fonts=False,
    )


@router.get(JS_PATH)
def redoc_script() -> Response:
    # The file changes only with the package: a browser keeps it a day.
    return Response(redoc_js(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})
