"""Agent enrolment: an agent exchanges an enrolment token, once per node, for its own node-bound agent token.

One enrolment token (scope `enrol`, usually with a node-name pattern and an expiry) is handed to every agent,
e.g. as a Kubernetes Secret; each agent calls `POST /api/v1/enrolments` with its node name and gets an agent
token bound to that node, which it keeps on the node's disk. So nobody mints a token per node by hand, and a
leaked node token writes only its own node's data. The threat model is in docs/deploy.md.

Refused: a name outside the token's pattern (403), a node that already holds an active agent token from an
enrolment (409: a second exchange would let whoever holds the enrolment token impersonate an enrolled node;
revoke the node's token to enrol it again), an expired or revoked enrolment token (401, at authentication).
"""

from __future__ import annotations

from datetime import datetime
from fnmatch import fnmatchcase

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.errors import Conflict, Forbidden, NotFound
from service.models import AgentEnrolment, ApiToken
from service.schemas import Joined
from service.tokens import service as tokens
from service.tokens.schemas import TokenCreated


def enrol(session: Session, *, enrolment_token_id: int, node_name: str, now: datetime) -> TokenCreated:
    """Issue `node_name` its agent token in exchange for the enrolment token, unless the node already has one."""
    grant = session.get(ApiToken, enrolment_token_id)
    if grant is None or grant.scope != "enrol":
        raise NotFound(f"no enrolment token with id {enrolment_token_id}")
    if grant.node_pattern and not fnmatchcase(node_name, grant.node_pattern):
        raise Forbidden(f"node {node_name!r} does not match this enrolment token's pattern {grant.node_pattern!r}")
    # One enrolment of a node at a time, whichever enrolment token each caller holds: two racing agents that
    # claim the same name cannot both get a token.
    session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": f"enrol:{node_name}"})
    held = session.scalars(
        select(ApiToken.id)
        .join(AgentEnrolment, AgentEnrolment.agent_token_id == ApiToken.id)
        .where(AgentEnrolment.node_name == node_name, tokens.active(now))
        .order_by(ApiToken.id)
    ).first()
    if held is not None:
        raise Conflict(
            f"node {node_name!r} is already enrolled (agent token #{held}); an enrolment is used once per node: "
            f"revoke that token (`faultline token revoke {held}`) to enrol the node again"
        )
    new = tokens.create(session, scope="agent", name=f"agent {node_name} (enrolled)", node_name=node_name)
    session.add(AgentEnrolment(node_name=node_name, enrolment_token_id=grant.id, agent_token_id=new.record.id))
    session.flush()
    session.refresh(new.record)
    return TokenCreated.model_validate(Joined(new.record, state=tokens.state_of(new.record, now=now), token=new.token))
