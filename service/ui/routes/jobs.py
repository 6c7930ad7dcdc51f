"""Jobs: the list, and one job's ranks, parallel groups and effective training time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from service.deps import DbSession
from service.errors import InvalidInput
from service.incidents import service as incidents
from service.models.jobs import JOB_STATES
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.ui.views import fleet as fleet_view
from service.ui.views import gpus
from service.ui.views import jobs as view

router = APIRouter(include_in_schema=False)


@router.get("/jobs")
def job_list(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    state: str = "",
    name: str = "",
    cursor: str = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    if state and state not in JOB_STATES:
        raise InvalidInput(f"state: {state!r} is not one of {', '.join(JOB_STATES)}")
    params = {k: v for k, v in {"state": state, "name": name, "cursor": cursor}.items() if v}
    result = view.list_jobs(
        session,
        state=state or None,
        name=name.strip() or None,
        limit=limit,
        cursor=cursor or None,
    )
    return page(request, "jobs.html", {"page": result, "params": params, "states": JOB_STATES})


# `:path`: a scheduler's job id may hold a slash (an array job, a namespace/name).
@router.get("/jobs/{job_id:path}")
def job_detail(request: Request, job_id: str, session: DbSession, _: ViewerDep) -> Response:
    now = datetime.now(UTC)
    v = view.job_view(session, job_id=job_id, now=now)
    spares = fleet_view.job_spares(session, job_id=job_id, now=now)
    # The machines its incidents are about too: an evicted one has left the ranks, and its incident's summary still
    # names its GPU, by index only if the page knows that machine's inventory.
    named = [p.node for p in v.placements] + incidents.machines_named(session, job_id=job_id)
    return page(request, "job.html", {"v": v, "spares": spares, "gpus": gpus.for_nodes(session, named)})
