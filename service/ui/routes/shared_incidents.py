"""Shared-cause incidents: the list, and one with its members and cordons."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from service.deps import DbSession
from service.models.shared_causes import COMPONENT_KINDS, SHARED_INCIDENT_STATES
from service.params import Id
from service.shared_causes import service as shared_causes
from service.ui.auth import ViewerDep
from service.ui.render import page

router = APIRouter(include_in_schema=False)
State = Literal[("", *SHARED_INCIDENT_STATES)]  # type: ignore[valid-type]
Kind = Literal[("", *COMPONENT_KINDS)]  # type: ignore[valid-type]


@router.get("/shared-incidents")
def shared_incidents_page(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    state: State = "",
    component_kind: Kind = "",
    node: Annotated[str, Query(max_length=253)] = "",
    cursor: str = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    node = node.strip()
    filters = {"state": state, "component_kind": component_kind, "node": node, "cursor": cursor}
    params: dict[str, str | int] = {k: v for k, v in filters.items() if v}
    if limit != 50:
        params["limit"] = limit
    result = shared_causes.list_incidents(
        session,
        state=state or None,
        component_kind=component_kind or None,
        node=node or None,
        limit=limit,
        cursor=cursor or None,
    )
    return page(
        request,
        "shared_incidents.html",
        {
            "page": result,
            "params": params,
            "states": SHARED_INCIDENT_STATES,
            "kinds": COMPONENT_KINDS,
            "detail": None,
        },
    )


@router.get("/shared-incidents/{incident_id}")
def shared_incident_page(request: Request, incident_id: Id, session: DbSession, _: ViewerDep) -> Response:
    detail = shared_causes.get(session, incident_id=incident_id)
    return page(request, "shared_incidents.html", {"detail": detail, "params": {}})
