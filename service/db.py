"""Engine, sessions and the transaction boundary.

Service functions only flush; the request or task boundary commits. Celery tasks enqueued (and other
actions registered) while a transaction is open run after it commits and are dropped if it rolls back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings

_AFTER_COMMIT = "faultline_after_commit"


@lru_cache
def get_engine(url: str | None = None) -> Engine:
    settings = get_settings()
    return create_engine(
        url or settings.sqlalchemy_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"connect_timeout": 5},
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session] | None = None) -> Iterator[Session]:
    """A unit of work for tasks and CLI commands: commit on success, roll back on error."""
    session = (factory or make_sessionmaker(get_engine()))()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run `action` once the session's transaction commits; forget it on rollback."""
    session.info.setdefault(_AFTER_COMMIT, []).append(action)


def enqueue_after_commit(session: Session, task: Any, *args: Any, **kwargs: Any) -> None:
    """Send a Celery task once the session's transaction commits; forget it on rollback."""
    after_commit(session, lambda: task.apply_async(args=args, kwargs=kwargs))


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    for action in session.info.pop(_AFTER_COMMIT, []):
        action()


@event.listens_for(Session, "after_rollback")
def _drop_after_commit(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)
