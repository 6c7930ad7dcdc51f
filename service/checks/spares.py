"""Idle spares checked on a schedule with a budget (IBM Autopilot's way: validate nodes between jobs, so a spare
swapped in for a failing node is not itself broken).

A beat task (service/checks/tasks.py) sends the level-1 checks (seconds: driver state, host, ports, dcgmi -r 1)
to idle spares: healthy nodes, with no rank of a running job, whose agent reported within
AGENT_FRESH_S (nobody else would answer), and whose last check result is older than
`checks_spare_interval_s`; the longest unchecked first, at most `checks_spare_max_concurrent` suites in flight
(sent, unexpired, no result yet). Their results are stored and judged like any others: a failure is a finding on
the node for a person, and a passing figure joins the fleet's history the cut-offs come from.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Text, and_, cast, exists, func, or_, select
from sqlalchemy.orm import Session

from service.checks.service import request_checks
from service.config import Settings
from service.models import CheckResult, Directive, Job, Node, Rank

ACTOR = "faultline spare checks"
LEVEL = 1
TTL_S = 600  # an idle agent reports every few seconds and level 1 takes seconds: longer means it is gone
AGENT_FRESH_S = 120.0
IN_SERVICE = ("healthy",)  # a returning node is already being checked: its gate


def in_flight(session: Session, *, now: datetime) -> int:
    """Spare checks sent, unexpired and not yet answered."""
    answered = exists().where(CheckResult.directive_id == cast(Directive.id, Text))
    return (
        session.scalar(
            select(func.count())
            .select_from(Directive)
            .where(
                Directive.kind == "run_checks",
                Directive.requested_by == ACTOR,
                Directive.expires_at > now,
                ~answered,
            )
        )
        or 0
    )


def due(session: Session, *, now: datetime, interval_s: float, limit: int) -> list[Node]:
    """Idle spares whose last check is older than the interval, the longest unchecked first."""
    busy = exists().where(
        Rank.node_id == Node.id, Rank.job_id == Job.id, Job.state == "running"
    )  # a rank of a running job: the node is in use
    pending = exists().where(Directive.node_id == Node.id, Directive.kind == "run_checks", Directive.expires_at > now)
    last = select(CheckResult.node_id, func.max(CheckResult.ts).label("last")).group_by(CheckResult.node_id).subquery()
    rows = session.scalars(
        select(Node)
        .outerjoin(last, last.c.node_id == Node.id)
        .where(
            Node.state.in_(IN_SERVICE),
            Node.last_seen_at > now - timedelta(seconds=AGENT_FRESH_S),
            ~busy,
            ~pending,
            or_(last.c.last.is_(None), and_(last.c.last < now - timedelta(seconds=interval_s))),
        )
        .order_by(last.c.last.asc().nulls_first(), Node.name)
        .limit(limit)
    )
    return list(rows)


def check_idle_spares(session: Session, *, now: datetime, settings: Settings) -> list[str]:
    """Send the level-1 checks to the idle spares that are due, within the budget; their names."""
    if settings.checks_spare_interval_s <= 0:
        return []
    room = settings.checks_spare_max_concurrent - in_flight(session, now=now)
    if room <= 0:
        return []
    sent = []
    for node in due(session, now=now, interval_s=settings.checks_spare_interval_s, limit=room):
        request_checks(
            session,
            node=node,
            level=LEVEL,
            force=False,
            peer=None,
            requested_by=ACTOR,
            reason=f"idle spare: last checked over {settings.checks_spare_interval_s / 3600:g} h ago, or never",
            ttl_s=TTL_S,
        )
        sent.append(node.name)
    return sent
