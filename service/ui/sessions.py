"""Web UI sessions: who is signed in, until when, and the CSRF token their forms must echo."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.errors import Forbidden, Unauthenticated
from service.models import ApiToken, UiSession
from service.security import find_by_token

# Who may sign in to the UI: people's scopes. Agents and schedulers are programs with tokens of their own.
UI_SCOPES = ("operator", "admin")


@dataclass(frozen=True)
class Viewer:
    """The signed-in person, as pages and forms see them."""

    session_id: int
    name: str
    scope: str
    csrf_token: str
    via_proxy: bool

    @property
    def actor(self) -> str:
        """The same form as an API token's actor, so histories read alike whichever way someone acted."""
        return f"{self.scope}:{self.name}"

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"


@dataclass(frozen=True)
class NewSession:
    key: str  # goes in the cookie; only its hash is stored
    viewer: Viewer


def _hash(key: str) -> str:
    # 256 random bits: a fast hash suffices, there is nothing to brute-force.
    return hashlib.sha256(key.encode()).hexdigest()


def _open(session: Session, *, name: str, scope: str, token_id: int | None, now: datetime, hours: float) -> NewSession:
    key = secrets.token_urlsafe(32)
    row = UiSession(
        key_hash=_hash(key),
        token_id=token_id,
        user_name=name,
        scope=scope,
        csrf_token=secrets.token_urlsafe(32),
        created_at=now,
        expires_at=now + timedelta(hours=hours),
    )
    session.add(row)
    session.flush()
    return NewSession(key=key, viewer=_viewer(row))


def _viewer(row: UiSession) -> Viewer:
    return Viewer(
        session_id=row.id,
        name=row.user_name,
        scope=row.scope,
        csrf_token=row.csrf_token,
        via_proxy=row.token_id is None,
    )


def sign_in(session: Session, *, token: str, now: datetime, hours: float) -> NewSession:
    """Open a session for the holder of an operator or admin token; refuse any other token with the reason."""
    record = find_by_token(session, token=token.strip())
    if record is None:
        raise Unauthenticated("this token is not known to faultline")
    if record.revoked_at is not None:
        raise Unauthenticated("this token was revoked")
    if record.expires_at is not None and record.expires_at <= now:
        raise Unauthenticated("this token has expired")
    if record.scope not in UI_SCOPES:
        raise Forbidden(f"the web UI is for people: sign in with an operator or admin token, not a {record.scope} one")
    name = record.name or f"token #{record.id}"
    return _open(session, name=name, scope=record.scope, token_id=record.id, now=now, hours=hours)


def sign_in_proxied(session: Session, *, user: str, scope: str, now: datetime, hours: float) -> NewSession:
    """Open a session for a user an authenticating proxy vouched for."""
    return _open(session, name=user, scope=scope, token_id=None, now=now, hours=hours)


def lookup(session: Session, *, key: str, now: datetime) -> Viewer | None:
    """The viewer behind a cookie, or None when it is unknown, expired, or its token was revoked or expired."""
    row = session.execute(
        select(UiSession, ApiToken.revoked_at, ApiToken.expires_at)
        .outerjoin(ApiToken, ApiToken.id == UiSession.token_id)
        .where(UiSession.key_hash == _hash(key), UiSession.expires_at > now)
    ).first()
    if row is None:
        return None
    ui_session, revoked_at, token_expires_at = row
    if revoked_at is not None or (token_expires_at is not None and token_expires_at <= now):
        return None
    return _viewer(ui_session)


def sign_out(session: Session, *, key: str) -> None:
    session.execute(delete(UiSession).where(UiSession.key_hash == _hash(key)))


def prune_expired(session: Session, *, now: datetime) -> int:
    """Forget sessions past their end (run by the maintenance task, through service/ui/retention.py)."""
    return session.execute(delete(UiSession).where(UiSession.expires_at <= now)).rowcount or 0
