"""One incident: what broke, on which machine, why faultline thinks so, what it did; chat alerts link here."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.deps import DbSession
from service.params import Id
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.ui.views import incident as view

router = APIRouter(include_in_schema=False)


@router.get("/incidents/{incident_id}")
def incident(request: Request, incident_id: Id, session: DbSession, _: ViewerDep) -> Response:
    p = view.incident_page(session, incident_id=incident_id)
    return page(request, "incident.html", {"p": p, "i": p.incident, "return_to": f"/incidents/{incident_id}"})
