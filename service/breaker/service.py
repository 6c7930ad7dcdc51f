"""The fleet circuit breaker: automatic take-outs stop when too much of the fleet is out; a person resets it.

State lives in one PostgreSQL row (`fleet_breaker`), locked by every decision that would take a node out, so API and
worker processes see one state and two workers deciding at once cannot both pass under the limit (the second
counts after the first commits). Functions flush; the caller's transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.breaker import rule
from service.breaker.schemas import BreakerEventOut, BreakerOut
from service.config import Settings
from service.errors import Conflict
from service.models import BreakerEvent, Decision, FleetBreaker, Node
from service.models.breaker import BREAKER_ROW
from service.notify import service as notify

ACTOR = "faultline"
RAIL = "fleet_breaker"
HELD = "held for a person"  # how the rail of a decision it held begins
# A counted take-out is no longer out once its node is back in service.
_BACK = ("healthy", "returning")
_CARRIED_OUT = ("done", "acknowledged")


@dataclass(frozen=True, slots=True)
class Admission:
    """The breaker's word on one candidate decision: whether it goes to schedulers, and the guard rail's text."""

    admitted: bool
    rail: str


def _row(session: Session, *, lock: bool) -> FleetBreaker:
    """The breaker's row, created closed if a truncation removed it."""
    session.execute(insert(FleetBreaker).values(id=BREAKER_ROW, state="closed").on_conflict_do_nothing())
    query = select(FleetBreaker).where(FleetBreaker.id == BREAKER_ROW)
    if lock:
        query = query.with_for_update()
    row = session.scalar(query.execution_options(populate_existing=True))
    assert row is not None  # inserted above
    return row


def _since(row: FleetBreaker, *, now: datetime, settings: Settings) -> datetime:
    start = now - timedelta(seconds=settings.breaker_window_s)
    return max(start, row.reset_at) if row.reset_at is not None else start


def _limit(fleet: int, settings: Settings) -> int:
    return rule.most_out(
        fleet,
        share=settings.breaker_max_share,
        min_nodes=settings.breaker_min_nodes,
        max_nodes=settings.breaker_max_nodes,
    )


def out_nodes(session: Session, *, since: datetime) -> set[str]:
    """Nodes faultline's own decisions took out (or are about to) since then, and still out: a pending take-out,
    or one carried out whose node is not back in service. A person's decisions (an override, a manual cordon)
    are a person's call and do not count."""
    automatic = or_(Decision.incident_id.is_not(None), Decision.shared_incident_id.is_not(None))
    rows = session.execute(
        select(Node.name)
        .join(Decision, Decision.node_id == Node.id)
        .where(
            Decision.kind.in_(rule.TAKE_OUT_KINDS),
            Decision.created_at >= since,
            automatic,
            Decision.evidence["manual"].astext.is_distinct_from("true"),
            or_(Decision.state == "pending", Decision.state.in_(_CARRIED_OUT) & Node.state.not_in(_BACK)),
        )
        .distinct()
    )
    return set(rows.scalars())


def admit(
    session: Session, *, candidates: Sequence[tuple[str, str]], now: datetime, settings: Settings
) -> list[Admission]:
    """The breaker's verdict on automatic decisions about to go to schedulers: (kind, node) each, in order.

    Locks the breaker's row (held until the caller commits), counts what is out, trips the breaker when a take-out
    would go over the limit (recorded, alerted once), and answers per candidate. Kinds the breaker never holds
    (restart, rollback, return) pass without a lock."""
    if not settings.breaker_enabled or not any(kind in rule.HELD_KINDS for kind, _ in candidates):
        return [Admission(True, "") for _ in candidates]
    row = _row(session, lock=True)
    since = _since(row, now=now, settings=settings)
    out = out_nodes(session, since=since)
    fleet = int(session.scalar(select(func.count()).select_from(Node)) or 0)
    most = _limit(fleet, settings)
    verdict = rule.judge(out=out, candidates=candidates, most=most, tripped=row.state == "tripped")
    if verdict.trips:
        first = candidates[verdict.admitted.index(False)]
        _trip(session, row=row, out=verdict.out + 1, fleet=fleet, most=most, node=first[1], now=now, settings=settings)
    held = ""
    if row.state == "tripped" and row.tripped_at is not None:
        held = (
            f"{HELD}: the fleet breaker tripped at {row.tripped_at:%Y-%m-%d %H:%M:%S} UTC "
            f"({row.tripped_reason}); an operator's reset resumes automation"
        )
    passed = f"{verdict.out} of {fleet} nodes out by automatic decisions, within the limit of {most}"
    return [
        Admission(ok, "" if kind not in rule.HELD_KINDS else passed if ok else held)
        for ok, (kind, _) in zip(verdict.admitted, candidates, strict=True)
    ]


def _trip(
    session: Session,
    *,
    row: FleetBreaker,
    out: int,
    fleet: int,
    most: int,
    node: str,
    now: datetime,
    settings: Settings,
) -> None:
    """Trip: the row says so, the audit trail has it, and chat hears it once (keyed by the trip's event)."""
    share = out / fleet if fleet else 1.0
    reason = (
        f"taking {node} out would make {out} of {fleet} nodes ({share:.0%}) out by automatic decisions since "
        f"{_since(row, now=now, settings=settings):%Y-%m-%d %H:%M} UTC, over the limit of {most} "
        f"({settings.breaker_max_share:.0%} of the fleet"
        + (f", at most {settings.breaker_max_nodes}" if settings.breaker_max_nodes is not None else "")
        + ")"
    )
    row.state = "tripped"
    row.tripped_at = now
    row.tripped_reason = reason
    row.out_nodes, row.fleet_nodes, row.limit_nodes = out, fleet, most
    row.updated_at = now
    event = BreakerEvent(
        kind="tripped",
        at=now,
        actor=ACTOR,
        reason=reason,
        details={"out": out, "fleet": fleet, "limit": most, "node": node},
    )
    session.add(event)
    session.flush()
    notify.record_fleet_event(
        session,
        event="breaker_tripped",
        key=str(event.id),
        payload={
            "title": f"Fleet breaker tripped: automatic take-outs stopped at {out - 1} of {fleet} nodes",
            "summary": f"{reason}. Every decision that would take a node out or reset a GPU now waits for a "
            "person. Check the held decisions, fix or silence the rule, then reset the breaker (UI banner, "
            "`faultline breaker reset --reason ...` or POST /api/v1/breaker/reset).",
        },
        path="/decisions?state=awaiting_approval",
        now=now,
    )


def held_count(session: Session) -> int:
    """Decisions the breaker held that still wait for a person (approve or reject each; a reset leaves them)."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(Decision)
            .where(
                Decision.state == "awaiting_approval",
                Decision.evidence["guard_rails"][RAIL].astext.startswith(HELD),
            )
        )
        or 0
    )


@dataclass(frozen=True, slots=True)
class Tripped:
    """What every UI page's banner says while the breaker is tripped."""

    at: datetime | None
    reason: str | None
    held: int


def tripped(session: Session) -> Tripped | None:
    """The banner's facts when the breaker is tripped, else None: one primary-key read while it is closed."""
    row = session.get(FleetBreaker, BREAKER_ROW)
    if row is None or row.state != "tripped":
        return None
    return Tripped(row.tripped_at, row.tripped_reason, held_count(session))


def status(session: Session, *, now: datetime, settings: Settings) -> BreakerOut:
    row = _row(session, lock=False)
    since = _since(row, now=now, settings=settings)
    fleet = int(session.scalar(select(func.count()).select_from(Node)) or 0)
    events = session.scalars(select(BreakerEvent).order_by(BreakerEvent.id.desc()).limit(20)).all()
    return BreakerOut(
        state=row.state,  # type: ignore[arg-type]
        enabled=settings.breaker_enabled,
        tripped_at=row.tripped_at,
        tripped_reason=row.tripped_reason,
        out_nodes=row.out_nodes,
        fleet_nodes=row.fleet_nodes,
        limit_nodes=row.limit_nodes,
        held_decisions=held_count(session),
        out_now=len(out_nodes(session, since=since)),
        limit_now=_limit(fleet, settings),
        fleet_now=fleet,
        counting_since=since,
        reset_at=row.reset_at,
        reset_by=row.reset_by,
        reset_reason=row.reset_reason,
        events=[BreakerEventOut.model_validate(e) for e in events],
    )


def reset(session: Session, *, reason: str, actor: str, now: datetime, settings: Settings) -> BreakerOut:
    """A person resumes automation: closed, counting from now, in the audit trail. The decisions it held stay
    waiting for a person (approve or reject each: they were made while a rule may have been wrong)."""
    row = _row(session, lock=True)
    if row.state != "tripped":
        raise Conflict("the fleet breaker is not tripped: there is nothing to reset")
    held = held_count(session)
    session.add(
        BreakerEvent(
            kind="reset",
            at=now,
            actor=actor,
            reason=reason,
            details={"tripped_at": row.tripped_at.isoformat() if row.tripped_at else None, "held_decisions": held},
        )
    )
    row.state = "closed"
    row.reset_at, row.reset_by, row.reset_reason = now, actor, reason
    row.updated_at = now
    session.flush()
    return status(session, now=now, settings=settings)
