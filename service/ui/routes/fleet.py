"""The fleet page: repair times over a window."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.deps import DbSession
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.ui.views import fleet as view

router = APIRouter(include_in_schema=False)


@router.get("/fleet")
def fleet(request: Request, session: DbSession, _: ViewerDep, window: str = "7d") -> Response:
    v = view.fleet_view(session, window=window, now=datetime.now(UTC))
    return page(request, "fleet.html", {"v": v, "windows": view.WINDOWS})
