"""Request-scoped plumbing shared by routes: the session whose commit is the request boundary."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.db import session_scope


def _session(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.sessionmaker) as session:
        yield session


# scope="function": commit before the response is sent, so a failed commit is the client's error
# response rather than a lost write behind a 200.
DbSession = Annotated[Session, Depends(_session, scope="function")]
