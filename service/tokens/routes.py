"""API tokens for admins: /api/v1/tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, status

from service.deps import DbSession
from service.params import Id
from service.security import Principal, require_scope
from service.tokens import enrolment, service
from service.tokens.schemas import EnrolmentIn, TokenCreated, TokenIn, TokenOut

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])
Admin = Annotated[Principal, Depends(require_scope("admin"))]
Enroller = Annotated[Principal, Depends(require_scope("enrol"))]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TokenCreated,
    responses={422: {"description": "Unknown scope, a node binding on a non-agent token, or a past expiry"}},
)
def create_token(token_in: TokenIn, session: DbSession, _: Admin) -> TokenCreated:
    """Create a token. The response carries the plain token; it is stored only as a hash and never shown again."""
    return service.issue(session, token_in=token_in, now=datetime.now(UTC))


@router.get("", response_model=list[TokenOut])
def list_tokens(session: DbSession, _: Admin) -> list[TokenOut]:
    """Every token, oldest first, with its state (active, expired, revoked); never the token or its hash."""
    now = datetime.now(UTC)
    return [service.to_out(record, now=now) for record in service.list_all(session)]


@router.get("/{token_id}", response_model=TokenOut, responses={404: {"description": "Unknown token"}})
def get_token(token_id: Id, session: DbSession, _: Admin) -> TokenOut:
    """One token's record."""
    return service.to_out(service.get(session, token_id=token_id), now=datetime.now(UTC))


@router.delete(
    "/{token_id}",
    response_model=TokenOut,
    responses={404: {"description": "Unknown token"}, 409: {"description": "The last active admin token"}},
)
def revoke_token(token_id: Id, session: DbSession, _: Admin) -> TokenOut:
    """Revoke a token (idempotent; the record stays). API processes honour it within `token_cache_seconds`."""
    return service.to_out(service.revoke(session, token_id=token_id), now=datetime.now(UTC))


@router.post(
    "/enrol",
    status_code=status.HTTP_201_CREATED,
    response_model=TokenCreated,
    responses={
        401: {"description": "The enrolment token is unknown, expired or revoked"},
        403: {"description": "Not an enrolment token, or the node name is outside its pattern"},
        409: {"description": "The node is already enrolled: revoke its agent token to enrol it again"},
    },
)
def enrol_agent(enrolment_in: EnrolmentIn, session: DbSession, principal: Enroller) -> TokenCreated:
    """Exchange an enrolment token (scope `enrol`) for this node's own agent token, once per node."""
    return enrolment.enrol(
        session, enrolment_token_id=principal.token_id, node_name=enrolment_in.node_name, now=datetime.now(UTC)
    )
