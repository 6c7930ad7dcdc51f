"""Job registration for schedulers: /api/v1/jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from service.deps import DbSession
from service.jobs import service
from service.jobs.schemas import JobIn, JobOut
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]


@router.post("", response_model=JobOut, responses={422: {"description": "Invalid job, e.g. tp*pp*dp != world_size"}})
def register_job(job_in: JobIn, session: DbSession, _: Reader) -> JobOut:
    """Register a job, or update it: world size, parallelism, hang timeout, optional rank placement."""
    job = service.register(session, job_in=job_in)
    return service.describe(session, job=job)


@router.get("/{job_id}", response_model=JobOut, responses={404: {"description": "Unknown job"}})
def get_job(job_id: str, session: DbSession, _: Reader) -> JobOut:
    """A job with its parallelism and rank-to-node map."""
    return service.describe(session, job=service.get_by_external_id(session, job_id=job_id))
