"""Silences: create, read and end them; and which silence, if any, covers a job or its nodes right now."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from fnmatch import fnmatchcase

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from service.errors import InvalidInput, NotFound
from service.models import Silence
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined
from service.security import Principal
from service.silences.schemas import SilenceIn, SilenceOut, SilencePage, SilenceState


def create(session: Session, *, silence_in: SilenceIn, principal: Principal, now: datetime) -> Silence:
    """Open a silence; the author defaults to the caller's token name."""
    starts_at = silence_in.starts_at or now
    if silence_in.ends_at is not None:
        ends_at = silence_in.ends_at
    else:
        assert silence_in.duration_s is not None  # the schema requires one of them
        ends_at = starts_at + timedelta(seconds=silence_in.duration_s)
    if ends_at <= now:
        raise InvalidInput(f"ends_at {ends_at.isoformat()} is in the past: such a silence would mute nothing")
    if ends_at <= starts_at:
        raise InvalidInput(f"ends_at {ends_at.isoformat()} must be after starts_at {starts_at.isoformat()}")
    silence = Silence(
        node_pattern=silence_in.node_pattern,
        job_pattern=silence_in.job_pattern,
        starts_at=starts_at,
        ends_at=ends_at,
        author=silence_in.author or principal.name or f"token #{principal.token_id}",
        comment=silence_in.comment,
    )
    session.add(silence)
    session.flush()
    # created_at is a server default.
    session.refresh(silence)
    return silence


def get(session: Session, *, silence_id: int) -> Silence:
    silence = session.get(Silence, silence_id)
    if silence is None:
        raise NotFound(f"no silence {silence_id}")
    return silence


def expire(session: Session, *, silence_id: int, now: datetime) -> Silence:
    """End a silence now; the row stays for the record. Ending an ended silence changes nothing."""
    silence = session.scalar(select(Silence).where(Silence.id == silence_id).with_for_update())
    if silence is None:
        raise NotFound(f"no silence {silence_id}")
    if state_of(silence, now=now) != "expired":
        silence.expired_at = now
        session.flush()
    return silence


def _end() -> ColumnElement[datetime]:
    """When a silence stops muting: its planned end, or earlier when someone ended it."""
    return func.least(Silence.ends_at, func.coalesce(Silence.expired_at, Silence.ends_at))


def _state_filter(state: SilenceState, now: datetime) -> ColumnElement[bool]:
    if state == "active":
        return (Silence.starts_at <= now) & (_end() > now)
    if state == "pending":
        return (Silence.starts_at > now) & (_end() > now)
    return _end() <= now


def state_of(silence: Silence, *, now: datetime) -> SilenceState:
    end = min(silence.ends_at, silence.expired_at or silence.ends_at)
    if end <= now:
        return "expired"
    return "pending" if silence.starts_at > now else "active"


def to_out(silence: Silence, *, now: datetime) -> SilenceOut:
    """The silence as the API shows it, with its state at `now`."""
    return SilenceOut.model_validate(Joined(silence, state=state_of(silence, now=now)))


def list_silences(
    session: Session, *, state: SilenceState | None, limit: int, cursor: str | None, now: datetime
) -> SilencePage:
    """Silences, newest first, optionally in one state."""
    query = select(Silence).order_by(Silence.id.desc()).limit(limit + 1)
    if state is not None:
        query = query.where(_state_filter(state, now))
    if cursor is not None:
        query = query.where(Silence.id < decode_cursor(cursor))
    rows = list(session.scalars(query))
    page, more = rows[:limit], len(rows) > limit
    return SilencePage(
        items=[to_out(s, now=now) for s in page],
        next_cursor=encode_cursor(page[-1].id) if more else None,
    )


def active_silences(session: Session, *, now: datetime) -> list[Silence]:
    """The silences muting at `now`: few at any time, so callers match them in Python."""
    return list(
        session.scalars(
            select(Silence)
            .where(
                Silence.starts_at <= now,
                Silence.ends_at > now,
                or_(Silence.expired_at.is_(None), Silence.expired_at > now),
            )
            .order_by(Silence.id)
        )
    )


def matches(silence: Silence, *, job: str | None, node: str | None) -> bool:
    """Whether the silence covers `node` in `job`: every pattern it has must match (None matches no pattern)."""
    if silence.job_pattern is not None and (job is None or not fnmatchcase(job, silence.job_pattern)):
        return False
    return silence.node_pattern is None or (node is not None and fnmatchcase(node, silence.node_pattern))


def _first(candidates: Sequence[Silence]) -> Silence | None:
    # The one that mutes longest is what a person wants to see ("silenced until ..."); ties by id.
    return max(candidates, key=lambda s: (s.ends_at, -s.id), default=None)


def covering(silences: Sequence[Silence], *, job: str | None, nodes: Iterable[str]) -> Silence | None:
    """Of these (active) silences, the one covering this job or any of these nodes.

    A job-only silence matches when the job does; a node-only one when any node does; one with both
    patterns when the job and at least one node match.
    """
    nodes = list(nodes)
    return _first(
        [
            s
            for s in silences
            if (s.node_pattern is None and matches(s, job=job, node=None))
            or any(matches(s, job=job, node=n) for n in nodes)
        ]
    )


def covered_nodes(silences: Sequence[Silence], *, nodes: Iterable[str], job: str | None) -> dict[str, int]:
    """node -> id of the silence covering it in this job; a job-only silence covers all of the job's nodes."""
    covered: dict[str, int] = {}
    for node in nodes:
        found = _first([s for s in silences if matches(s, job=job, node=node)])
        if found is not None:
            covered[node] = found.id
    return covered
