"""Incidents: the filtered list, newest first (one incident's page is routes/incidents.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from ml.findings import CATEGORIES
from service.deps import DbSession
from service.errors import InvalidInput
from service.incidents import service as incidents
from service.models.diagnosis import INCIDENT_STATES
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.ui.views import gpus

router = APIRouter(include_in_schema=False)

# "unresolved" (open or mitigating) first: what on-call looks for; then each state.
STATE_CHOICES = ("unresolved", *INCIDENT_STATES)


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value and value not in allowed:
        raise InvalidInput(f"{name}: {value!r} is not one of {', '.join(allowed)}")


@router.get("/incidents")
def incident_list(
    request: Request,
    session: DbSession,
    _: ViewerDep,
    state: str = "",
    severity: str = "",
    job: str = "",
    node: str = "",
    root_cause: str = "",
    cursor: str = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    # A typo in a hand-edited URL says so rather than showing an empty list that looks like calm.
    _check("state", state, STATE_CHOICES)
    _check("severity", severity, incidents.SEVERITIES)
    _check("root_cause", root_cause, CATEGORIES)
    job, node = job.strip(), node.strip()
    filters = {
        "state": state,
        "severity": severity,
        "job": job,
        "node": node,
        "root_cause": root_cause,
        "cursor": cursor,
    }
    params: dict[str, str | int] = {k: v for k, v in filters.items() if v}
    if limit != 50:
        params["limit"] = limit
    result = incidents.list_incidents(
        session,
        job=job or None,
        node=node or None,
        state=state or None,
        severity=severity or None,
        root_cause=root_cause or None,
        limit=limit,
        cursor=cursor or None,
    )
    return page(
        request,
        "incident_list.html",
        {
            "page": result,
            "params": params,
            "states": STATE_CHOICES,
            "severities": incidents.SEVERITIES,
            "root_causes": CATEGORIES,
            "gpus": gpus.for_nodes(session, [s.node for i in result.items for s in i.suspects]),
        },
    )
