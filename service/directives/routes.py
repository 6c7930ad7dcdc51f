"""/api/v1/jobs/{job_id}/stack-dumps: ask a job's agents for stacks, and read them."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, status

from service.deps import DbSession
from service.directives import service
from service.directives.schemas import DirectiveOut, StackDumpRequest, StackDumpsOut
from service.jobs.service import get_by_external_id
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/jobs/{job_id}/stack-dumps", tags=["jobs"])
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DirectiveOut,
    responses={404: {"description": "Unknown job"}},
)
def request_stack_dump(
    job_id: str, session: DbSession, principal: Operator, body: StackDumpRequest | None = None
) -> DirectiveOut:
    """Ask every agent of the job to dump its training processes' stacks (py-spy) with its next batch."""
    body = body or StackDumpRequest()
    job = get_by_external_id(session, job_id=job_id)
    directive = service.request_stack_dump(
        session,
        job=job,
        requested_by=principal.name or f"token {principal.token_id}",
        reason=body.reason,
        ttl_s=body.ttl_s,
    )
    return service.to_out(directive, job_id=job_id)


@router.get("/{directive_id}", response_model=StackDumpsOut, responses={404: {"description": "Unknown job or request"}})
def get_stack_dumps(job_id: str, directive_id: uuid.UUID, session: DbSession, _: Reader) -> StackDumpsOut:
    """The dumps agents sent for one request, by rank, each with its main thread's frames."""
    return service.stack_dumps(session, job_id=job_id, directive_id=directive_id)
