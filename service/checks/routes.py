"""/api/v1/nodes/{name}/checks: ask a node's agent for the stop-time checks, and read their results."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from service.checks import service
from service.checks.schemas import CheckResultOut, CheckResultsOut, NodeDirectiveOut, RunChecksOut, RunChecksRequest
from service.deps import DbSession
from service.errors import ErrorBody, InvalidInput
from service.models import Directive, Node
from service.nodes.service import get_by_name
from service.security import Principal, require_scope

router = APIRouter(prefix="/api/v1/nodes/{name}/checks", tags=["nodes"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
Operator = Annotated[Principal, Depends(require_scope("operator", "admin"))]
_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such node (or peer)"}}


def _out(directive: Directive, node: Node) -> NodeDirectiveOut:
    return NodeDirectiveOut(
        id=directive.id,
        node=node.name,
        kind=directive.kind,
        params=directive.params or {},
        reason=directive.reason,
        requested_by=directive.requested_by,
        created_at=directive.created_at,
        expires_at=directive.expires_at,
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RunChecksOut, responses=_NOT_FOUND)
def run_checks(name: str, body: RunChecksRequest, session: DbSession, principal: Operator) -> RunChecksOut:
    """Ask the node's agent to run the stop-time checks at a level (with a peer, the peer's agent too)."""
    node = get_by_name(session, name=name)
    peer = get_by_name(session, name=body.peer) if body.peer is not None else None
    if peer is not None and peer.id == node.id:
        raise InvalidInput("the peer must be another node")
    directives = service.request_checks(
        session,
        node=node,
        level=body.level,
        force=body.force,
        peer=peer,
        reason=body.reason,
        ttl_s=body.ttl_s,
        return_on_pass=body.return_on_pass,
        requested_by=principal.name or f"token {principal.token_id}",
    )
    session.refresh(directives[0])
    nodes = [node, peer] if peer is not None else [node]
    return RunChecksOut(directives=[_out(d, n) for d, n in zip(directives, nodes, strict=True)])


@router.get("", response_model=CheckResultsOut, responses=_NOT_FOUND)
def check_results(
    name: str,
    session: DbSession,
    _: Reader,
    directive_id: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> CheckResultsOut:
    """The node's most recent check results, newest first, each with the agent's status and the service's verdict."""
    node = get_by_name(session, name=name)
    rows = service.results_of(session, node=node, directive_id=directive_id, limit=limit)
    return CheckResultsOut(node=node.name, results=[CheckResultOut.model_validate(r) for r in rows])
