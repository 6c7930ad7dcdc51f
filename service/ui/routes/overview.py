"""The overview page."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.deps import DbSession
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.ui.views import gpus
from service.ui.views import overview as view

router = APIRouter(include_in_schema=False)


@router.get("/")
def overview(
    request: Request, session: DbSession, _: ViewerDep, group: Literal["job", "rack", "switch"] = "job"
) -> Response:
    settings = request.app.state.settings
    o = view.overview(
        session,
        now=datetime.now(UTC),
        window_s=settings.diagnosis_window_s,
        recent_hours=settings.ui_recent_hours,
        no_progress_s=settings.job_no_progress_s,
        group_by=group,
    )
    return page(
        request,
        "overview.html",
        {
            "o": o,
            "gpus": gpus.for_nodes(
                session,
                [
                    *(d.node for d in o.waiting),
                    *(n for i in o.recent for n in i.suspects),
                    *(x.node for i in o.recent for x in i.outcomes),
                    *(n.name for n in o.needs),
                ],
            ),
        },
    )
