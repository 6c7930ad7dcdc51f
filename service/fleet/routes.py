"""Repair times and spare capacity: /api/v1/repair-times, /api/v1/incidents/{id}/repair-times, /api/v1/spares."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from service.deps import DbSession
from service.errors import ErrorBody
from service.fleet import service
from service.fleet.schemas import GroupOut, IncidentRepairTimesOut, RepairTimesOut, SparesOut
from service.fleet.spans import parse_span
from service.params import Id
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1", tags=["fleet"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
By = Literal["fleet", "node", "root_cause"]

_BAD = {422: {"model": ErrorBody, "description": "A bad window, horizon, quantile or grouping"}}
Window = Annotated[str, Query(max_length=16, description="How far back: `7d`, `24h`, `90m`, `3600s` (at most 366d)")]
Horizon = Annotated[str, Query(max_length=16, description="How far ahead to ride out failures: `24h`, `7d`, ...")]
Quantile = Annotated[float, Query(gt=0, lt=1, description="P(failures <= standbys) to reach, e.g. 0.99")]
Nodes = Annotated[int, Query(ge=1, le=1_000_000, description="Nodes of the job")]


@router.get("/repair-times", response_model=RepairTimesOut, responses=_BAD)
def get_repair_times(session: DbSession, _: Reader, window: Window = "7d", by: By = "fleet") -> RepairTimesOut:
    """p50/p90 of detect, decide, act and return for the incidents opened within the window, per fleet, root
    cause or node."""
    window_s = parse_span(window, field="query.window")
    now = datetime.now(UTC)
    groups, counted = service.repair_times_by(session, window_s=window_s, by=by, now=now)
    return RepairTimesOut(
        window_s=window_s,
        since=now - timedelta(seconds=window_s),
        by=by,
        incidents=counted,
        groups=[GroupOut.of(g) for g in groups],
    )


@router.get(
    "/incidents/{incident_id}/repair-times",
    response_model=IncidentRepairTimesOut,
    responses={404: {"model": ErrorBody, "description": "Unknown incident"}},
)
def get_incident_repair_times(incident_id: Id, session: DbSession, _: Reader) -> IncidentRepairTimesOut:
    """One incident's stages; a stage that has not happened yet is null."""
    return IncidentRepairTimesOut.of(service.incident_times(session, incident_id=incident_id))


@router.get("/spares", response_model=SparesOut, responses=_BAD)
def get_spares(
    session: DbSession,
    _: Reader,
    nodes: Nodes,
    horizon: Horizon = "24h",
    quantile: Quantile = 0.99,
    window: Window = "30d",
) -> SparesOut:
    """Warm standby nodes a job of `nodes` nodes needs over the horizon, from the fleet's failure rate (binomial)."""
    horizon_s = parse_span(horizon, field="query.horizon")
    window_s = parse_span(window, field="query.window")
    advice = service.spares_for(
        session, nodes=nodes, horizon_s=horizon_s, quantile=quantile, window_s=window_s, now=datetime.now(UTC)
    )
    return SparesOut.of(advice, job_id=None, window_s=window_s)


@router.get(
    "/jobs/{job_id}/spares",
    response_model=SparesOut,
    responses={
        **_BAD,
        404: {"model": ErrorBody, "description": "Unknown job"},
        409: {"model": ErrorBody, "description": "No rank of the job is placed yet and `nodes` was not given"},
    },
)
def get_job_spares(
    job_id: str,
    session: DbSession,
    _: Reader,
    horizon: Horizon = "24h",
    quantile: Quantile = 0.99,
    window: Window = "30d",
    nodes: Annotated[int | None, Query(ge=1, le=1_000_000, description="Override the job's placed nodes")] = None,
) -> SparesOut:
    """Warm standbys for the job's nodes over the horizon at the quantile (see `/api/v1/spares`)."""
    horizon_s = parse_span(horizon, field="query.horizon")
    window_s = parse_span(window, field="query.window")
    advice = service.job_spares(
        session,
        job_id=job_id,
        nodes=nodes,
        horizon_s=horizon_s,
        quantile=quantile,
        window_s=window_s,
        now=datetime.now(UTC),
    )
    return SparesOut.of(advice, job_id=job_id, window_s=window_s)
