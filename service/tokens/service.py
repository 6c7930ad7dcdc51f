"""Create, look up and revoke API tokens."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from service.errors import Conflict, InvalidInput, NotFound
from service.models import ApiToken
from service.models.auth import SCOPES
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined
from service.security import hash_token
from service.tokens.schemas import TokenCreated, TokenIn, TokenOut, TokenPage, TokenState

TOKEN_PREFIX = "fl_"


@dataclass(frozen=True)
class NewToken:
    token: str
    record: ApiToken


def create(
    session: Session,
    *,
    scope: str,
    name: str | None = None,
    node_name: str | None = None,
    node_pattern: str | None = None,
    ttl: timedelta | None = None,
    expires_at: datetime | None = None,
) -> NewToken:
    """Create a token; the plain value exists only in the return value."""
    if scope not in SCOPES:
        raise InvalidInput(f"unknown scope {scope!r}; expected one of {', '.join(SCOPES)}")
    if node_name is not None and scope != "agent":
        raise InvalidInput("only agent tokens can be bound to a node")
    if node_pattern is not None and scope != "enrol":
        raise InvalidInput("only enrolment tokens take a node pattern")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = ApiToken(
        token_hash=hash_token(token),
        prefix=token[:10],
        name=name,
        scope=scope,
        node_name=node_name,
        node_pattern=node_pattern,
        expires_at=datetime.now(UTC) + ttl if ttl else expires_at,
    )
    session.add(record)
    session.flush()
    return NewToken(token=token, record=record)


def list_all(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def list_page(
    session: Session, *, scope: str | None, state: TokenState | None, now: datetime, limit: int, cursor: str | None
) -> TokenPage:
    """Newest first, keyset-paginated on id, optionally of one scope and in one state."""
    query = select(ApiToken).order_by(ApiToken.id.desc()).limit(limit + 1)
    if scope:
        query = query.where(ApiToken.scope == scope)
    if state == "revoked":
        query = query.where(ApiToken.revoked_at.is_not(None))
    elif state == "expired":
        query = query.where(ApiToken.revoked_at.is_(None), ApiToken.expires_at <= now)
    elif state == "active":
        query = query.where(active(now))
    if cursor:
        query = query.where(ApiToken.id < decode_cursor(cursor))
    rows = list(session.scalars(query))
    page = rows[:limit]
    return TokenPage(
        items=[to_out(r, now=now) for r in page],
        next_cursor=encode_cursor(page[-1].id) if len(rows) > limit else None,
    )


def active(now: datetime) -> ColumnElement[bool]:
    return and_(ApiToken.revoked_at.is_(None), or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))


def revoke(session: Session, *, token_id: int, keep_an_admin: bool = True) -> ApiToken:
    """Revoke a token; revoking it again changes nothing.

    With `keep_an_admin` (the API and the UI) the last active admin token stays: revoking it would leave
    nobody able to manage tokens except someone with shell access to `faultline token`."""
    record = get(session, token_id=token_id)
    now = datetime.now(UTC)
    if record.revoked_at is None:
        if keep_an_admin and record.scope == "admin" and state_of(record, now=now) == "active":
            # Locked, so two admins revoking each other at once cannot both succeed.
            admins = session.scalars(
                select(ApiToken.id).where(ApiToken.scope == "admin", active(now)).with_for_update()
            ).all()
            if len(admins) <= 1:
                raise Conflict(
                    "this is the last active admin token: create another admin token before revoking it "
                    "(or use `faultline token revoke` on the server)"
                )
        record.revoked_at = now
        session.flush()
    return record


def get(session: Session, *, token_id: int) -> ApiToken:
    record = session.get(ApiToken, token_id)
    if record is None:
        raise NotFound(f"no token with id {token_id}")
    return record


def state_of(record: ApiToken, *, now: datetime) -> TokenState:
    """Revoked wins over expired: it is the deliberate act."""
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at is not None and record.expires_at <= now:
        return "expired"
    return "active"


def to_out(record: ApiToken, *, now: datetime) -> TokenOut:
    """The token's record as the API shows it, with its state at `now`; never the token or its hash."""
    return TokenOut.model_validate(Joined(record, state=state_of(record, now=now)))


def issue(session: Session, *, token_in: TokenIn, now: datetime) -> TokenCreated:
    """Create a token from an API request; the response is the only place its value appears."""
    if token_in.expires_at is not None and token_in.expires_at <= now:
        raise InvalidInput(f"expires_at {token_in.expires_at.isoformat()} is not in the future")
    new = create(
        session,
        scope=token_in.scope,
        name=token_in.name,
        node_name=token_in.node_name,
        node_pattern=token_in.node_pattern,
        ttl=timedelta(seconds=token_in.ttl_s) if token_in.ttl_s is not None else None,
        expires_at=token_in.expires_at,
    )
    # created_at is a server default: load it before describing the row.
    session.refresh(new.record)
    return TokenCreated.model_validate(Joined(new.record, state=state_of(new.record, now=now), token=new.token))
