"""Bearer-token authentication and scope checks as FastAPI dependencies.

Shared plumbing under every domain: it reads the api_tokens table itself and imports no domain, so the tokens
domain (which issues and revokes tokens, behind these same checks) can depend on it and not the other way.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.db import session_scope
from service.errors import Forbidden, Unauthenticated, error_response
from service.models import ApiToken


@dataclass(frozen=True)
class Principal:
    """Who is calling: resolved from a bearer token."""

    token_id: int
    scope: str
    node_name: str | None
    name: str | None
    expires_at: datetime | None

    @property
    def actor(self) -> str:
        """Who did it, for histories and audit fields: the token's name, else its id."""
        return f"{self.scope}:{self.name or f'token #{self.token_id}'}"


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def find_by_token(session: Session, *, token: str) -> ApiToken | None:
    return session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))


def to_principal(record: ApiToken) -> Principal:
    return Principal(
        token_id=record.id,
        scope=record.scope,
        node_name=record.node_name,
        name=record.name,
        expires_at=record.expires_at,
    )


class TokenCache:
    """Per-process cache of resolved tokens, so ingest does not query the database per request.

    A revoked token keeps working on a process for at most `ttl` seconds.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[str, tuple[float, Principal | None, str]] = {}
        self._pending: dict[str, asyncio.Future[tuple[Principal | None, str]]] = {}

    def get(self, token: str) -> tuple[Principal | None, str] | None:
        entry = self._entries.get(token)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1], entry[2]

    async def resolve(
        self, token: str, lookup: Callable[[], Awaitable[tuple[Principal | None, str]]]
    ) -> tuple[Principal | None, str]:
        """Look the token up once, however many requests carrying it arrive meanwhile."""
        pending = self._pending.get(token)
        if pending is None:
            pending = asyncio.ensure_future(lookup())
            self._pending[token] = pending
            pending.add_done_callback(lambda _: self._pending.pop(token, None))
        principal, problem = await asyncio.shield(pending)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[token] = (time.monotonic() + self.ttl, principal, problem)
        return principal, problem


def _lookup(request: Request, token: str) -> tuple[Principal | None, str]:
    with session_scope(request.app.state.sessionmaker) as session:
        record = find_by_token(session, token=token)
        if record is None:
            return None, "invalid token"
        if record.revoked_at is not None:
            return None, "token revoked"
        return to_principal(record), ""


async def authenticate(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("missing bearer token (Authorization: Bearer <token>)")
    token = token.strip()
    cache: TokenCache = request.app.state.token_cache
    hit = cache.get(token)
    if hit is None:
        hit = await cache.resolve(token, lambda: run_in_threadpool(_lookup, request, token))
    principal, problem = hit
    if principal is None:
        raise Unauthenticated(problem)
    if principal.expires_at is not None and principal.expires_at <= datetime.now(UTC):
        raise Unauthenticated("token expired")
    return principal


async def authorize(request: Request, scopes: tuple[str, ...]) -> Principal:
    """Authenticate, then admit only tokens with one of `scopes`."""
    principal = await authenticate(request)
    if principal.scope not in scopes:
        raise Forbidden(
            f"this endpoint needs a token with scope {' or '.join(scopes)}; this token has {principal.scope}"
        )
    return principal


def require_scope(*scopes: str) -> Callable[[Request], Coroutine[Any, Any, Principal]]:
    """The same check as a FastAPI dependency."""

    async def dependency(request: Request) -> Principal:
        return await authorize(request, scopes)

    return dependency


_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class AuthenticateBeforeBody:
    """ASGI middleware: an API request that may carry a body is authenticated before anything reads it, so a
    caller without a valid token cannot make a process read or parse one. Routes still check the scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _WITH_BODY and scope["path"].startswith("/api/"):
            try:
                await authenticate(Request(scope))
            except Exception as exc:
                response = error_response(exc)
                if response is None:
                    raise
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
