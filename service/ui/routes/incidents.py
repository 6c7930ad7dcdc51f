"""One incident: what broke, on which machine, why faultline thinks so, what it did; chat alerts link here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Form, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.bundles import service as bundles
from service.db import session_scope
from service.deps import DbSession
from service.errors import FaultlineError, NotFound
from service.incidents import service as incidents
from service.incidents.schemas import AcknowledgeIn, ResolveIn
from service.params import Id
from service.ui.auth import FormViewer, ViewerDep
from service.ui.render import page, redirect
from service.ui.views import checks as checks_view
from service.ui.views import incident as view
from service.validation import validated

router = APIRouter(include_in_schema=False)


@router.get("/incidents/{incident_id}")
def incident(request: Request, incident_id: Id, session: DbSession, _: ViewerDep) -> Response:
    try:
        p = view.incident_page(
            session, incident_id=incident_id, repeat_window_s=request.app.state.settings.node_repeat_window_s
        )
    except NotFound:
        return _missing(request, session, incident_id)
    context = {"p": p, "i": p.incident, "gpus": p.gpus, "return_to": f"/incidents/{incident_id}"}
    diagnose = [d.id for d in p.decisions if d.kind == "diagnose"]
    context["checks"] = checks_view.incident_checks(session, diagnose_decisions=diagnose)
    context["bundles"] = bundles.for_incident(session, incident_id=incident_id, now=datetime.now(UTC), known=True)
    return page(request, "incident.html", context)


def _missing(request: Request, session: Session, incident_id: int) -> Response:
    """A number with no incident says why numbers can skip and links the nearest ones, rather than a bare 404."""
    before, after = incidents.neighbours(session, incident_id=incident_id)
    if after is None:
        latest = f": the latest is #{before}" if before else ""
        error = NotFound(f"There is no incident #{incident_id} yet{latest}.")
    else:
        error = NotFound(
            f"There is no incident #{incident_id}: nothing happened under this number. Incident numbers come from "
            "one counter, and a number is skipped when the diagnosis pass that drew it did not keep it (two workers "
            "raced to open the same incident, or the pass failed and ran again; before this release every pass "
            "that found its incident already open drew one too)."
        )
    related = [
        (f"/incidents/{i}", f"{label}: incident #{i}") for i, label in ((before, "before"), (after, "after")) if i
    ]
    related.append(("/incidents", "all incidents"))
    return page(request, "error.html", {"error": error, "related": related}, status_code=404)


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


@router.post("/incidents/{incident_id}/acknowledge")
def acknowledge(request: Request, incident_id: Id, viewer: FormViewer, note: Annotated[str, Form()] = "") -> Response:
    back = f"/incidents/{incident_id}"
    try:
        body = validated(AcknowledgeIn, note=note.strip() or None)
        with session_scope(request.app.state.sessionmaker) as session:
            incidents.acknowledge(
                session, incident_id=incident_id, actor=viewer.actor, note=body.note, now=datetime.now(UTC)
            )
    except FaultlineError as exc:
        return redirect(request, back, flash=f"Not acknowledged: {exc.message}", refused=True)
    return redirect(request, back, flash=f"Incident {incident_id}: you are on it ({viewer.actor}).")
