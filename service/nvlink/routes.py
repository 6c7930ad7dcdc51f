"""NVLink domains for schedulers: /api/v1/nvlink-domains (keep a tensor-parallel group inside a healthy domain)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from service.deps import DbSession
from service.errors import ErrorBody, InvalidInput, NotFound
from service.nvlink import views
from service.nvlink.schemas import DomainOut, DomainPage
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/nvlink-domains", tags=["nvlink-domains"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]


@router.get("", response_model=DomainPage)
def list_domains(
    request: Request,
    session: DbSession,
    _: Reader,
    healthy: Annotated[bool | None, Query(description="Only healthy domains (true) or only the others (false)")] = None,
) -> DomainPage:
    """Every NVLink domain the agents report: its nodes and cliques, its state, and the nodes usable now."""
    items = views.domains(session, now=datetime.now(UTC), settings=request.app.state.settings)
    if healthy is not None:
        items = [d for d in items if d.healthy == healthy]
    return DomainPage(items=items)


@router.get(
    "/{cluster_uuid}",
    response_model=DomainOut,
    responses={
        404: {"model": ErrorBody, "description": "No node reports this domain"},
        422: {"model": ErrorBody, "description": "Not a UUID"},
    },
)
def get_domain(cluster_uuid: str, request: Request, session: DbSession, _: Reader) -> DomainOut:
    """One NVLink domain, by its fabric cluster UUID."""
    try:
        key = str(uuid.UUID(cluster_uuid))
    except ValueError:
        raise InvalidInput(f"not a fabric cluster UUID: {cluster_uuid[:80]!r}") from None
    found = views.domains(session, now=datetime.now(UTC), settings=request.app.state.settings, clusters=[key])
    if not found:
        raise NotFound(f"no node reports NVLink domain {key}")
    return found[0]
