"""Job registration for schedulers: /api/v1/jobs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from service.deps import DbSession
from service.jobs import ettr, progress, service
from service.jobs.schemas import EttrOut, JobEndIn, JobIn, JobOut, StalledJobsOut
from service.security import Principal, require_scope

router = APIRouter(tags=["jobs"])
# Every route of a job under /api/v1/jobs/{job_id}; the stalled list apart, so no job id can shadow it.
_jobs = APIRouter(prefix="/api/v1/jobs")
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]


@_jobs.post("", response_model=JobOut, responses={422: {"description": "Invalid job, e.g. tp*pp*dp != world_size"}})
def register_job(job_in: JobIn, session: DbSession, _: Reader) -> JobOut:
    """Register a job, or update it: world size, parallelism, hang timeout, optional rank placement."""
    job = service.register(session, job_in=job_in)
    return service.describe(session, job=job)


@_jobs.post(
    "/{job_id}/end",
    response_model=JobOut,
    responses={404: {"description": "Unknown job"}, 422: {"description": "Bad state"}},
)
def end_job(job_id: str, job_end: JobEndIn, session: DbSession, _: Reader) -> JobOut:
    """Mark a job ended (finished or failed), e.g. from a Slurm epilog; registering the same id again reopens it."""
    job = service.end(session, job_id=job_id, state=job_end.state)
    return service.describe(session, job=job)


@_jobs.get("/{job_id}", response_model=JobOut, responses={404: {"description": "Unknown job"}})
def get_job(job_id: str, session: DbSession, _: Reader) -> JobOut:
    """A job with its parallelism and rank-to-node map."""
    return service.describe(session, job=service.get_by_external_id(session, job_id=job_id))


@_jobs.get(
    "/{job_id}/ettr",
    response_model=EttrOut,
    responses={404: {"description": "Unknown job"}, 422: {"description": "A window that is not 1m to 30d"}},
)
def get_job_ettr(
    job_id: str,
    session: DbSession,
    _: Reader,
    window: Annotated[str, Query(max_length=16, description="The sliding window: 90s, 30m, 1h, 2d")] = "1h",
) -> EttrOut:
    """Effective training time from the job's step lines: cumulative and over the window, a time series, restarts,
    and the time each incident lost (down, and redoing steps since the last checkpoint)."""
    span = ettr.parse_window(window)
    job = service.get_by_external_id(session, job_id=job_id)
    report = ettr.job_ettr(session, job=job, now=datetime.now(UTC), window=span)
    return ettr.describe(job.external_id, window, report)


@router.get("/api/v1/stalled-jobs", response_model=StalledJobsOut)
def list_stalled_jobs(
    request: Request,
    session: DbSession,
    _: Reader,
    after_s: Annotated[
        float | None,
        Query(
            gt=0, le=30 * 86400, description="No net progress for longer than this; default FAULTLINE_JOB_NO_PROGRESS_S"
        ),
    ] = None,
) -> StalledJobsOut:
    """Running jobs that have made no net progress (no step past the highest one reached) for longer than the
    threshold, longest first, each with why: waiting for an action or a spare, hung, down, or restarting from the
    same checkpoint again and again."""
    threshold = after_s if after_s is not None else request.app.state.settings.job_no_progress_s
    now = datetime.now(UTC)
    return progress.describe(progress.stalled(session, now=now, after_s=threshold), after_s=threshold, now=now)


router.include_router(_jobs)
