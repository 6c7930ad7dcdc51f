"""One incident: what broke, on which machine, why faultline thinks so, what it did; chat alerts link here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from service.db import session_scope
from service.deps import DbSession
from service.errors import FaultlineError
from service.incidents import service as incidents
from service.incidents.schemas import ResolveIn
from service.params import Id
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import page, redirect
from service.ui.views import checks as checks_view
from service.ui.views import incident as view
from service.validation import validated

router = APIRouter(include_in_schema=False)


@router.get("/incidents/{incident_id}")
def incident(request: Request, incident_id: Id, session: DbSession, _: ViewerDep) -> Response:
    p = view.incident_page(session, incident_id=incident_id)
    context = {"p": p, "i": p.incident, "gpus": p.gpus, "return_to": f"/incidents/{incident_id}"}
    diagnose = [d.id for d in p.decisions if d.kind == "diagnose"]
    context["checks"] = checks_view.incident_checks(session, diagnose_decisions=diagnose)
    return page(request, "incident.html", context)


@router.post("/incidents/{incident_id}/resolve")
def resolve(request: Request, incident_id: Id, viewer: FormViewer, reason: Annotated[str, Form()] = "") -> Response:
    back = f"/incidents/{incident_id}"
    try:
        body = validated(ResolveIn, reason=reason)
        with session_scope(request.app.state.sessionmaker) as session:
            incidents.resolve_by_hand(
                session,
                incident_id=incident_id,
                reason=body.reason,
                actor=viewer.actor,
                now=datetime.now(UTC),
                settings=request.app.state.settings,
            )
    except FaultlineError as exc:
        return redirect(request, back, flash=f"Not resolved: {exc.message}", refused=True)
    return redirect(request, back, flash=f"Incident {incident_id} resolved.")
