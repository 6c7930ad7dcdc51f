"""/api/v1/preflight: a job's preflight reports its outcome (and reads the fleet's criteria first)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status

from service.deps import DbSession
from service.preflight import service
from service.preflight.schemas import CriteriaOut, PreflightIn, PreflightOut
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/preflight", tags=["preflight"])
# The preflight runs on the nodes with an agent's token: its results are data, as a batch's are.
Reporter = Annotated[Principal, Depends(require_scope("agent", "admin"))]
Reader = Annotated[Principal, Depends(require_scope("agent", "scheduler", "operator", "admin"))]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=PreflightOut)
def report_preflight(body: PreflightIn, session: DbSession, request: Request, _: Reporter) -> PreflightOut:
    """Store a preflight's results as check results and decide on the nodes it named, before the job starts."""
    return service.record(session, preflight=body, settings=request.app.state.settings)


@router.get("/criteria", response_model=CriteriaOut)
def preflight_criteria(
    session: DbSession, _: Reader, model: Annotated[str, Query(min_length=1, max_length=200)]
) -> CriteriaOut:
    """The fleet's cut-offs (ml/check_criteria.py) for a GPU model's GEMM, local and cross-node all-reduce."""
    return service.criteria(session, model=model)
