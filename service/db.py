"""Engine, sessions and the transaction boundary.

Service functions only flush; the request or task boundary commits. Celery tasks enqueued
while a transaction is open are sent after it commits and dropped if it rolls back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings

_PENDING_TASKS = "faultline_pending_tasks"


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


def enqueue_after_commit(session: Session, task: Any, *args: Any, **kwargs: Any) -> None:
    """Send a Celery task once the session's transaction commits; forget it on rollback."""
    session.info.setdefault(_PENDING_TASKS, []).append((task, args, kwargs))


@event.listens_for(Session, "after_commit")
def _send_pending_tasks(session: Session) -> None:
    for task, args, kwargs in session.info.pop(_PENDING_TASKS, []):
        task.apply_async(args=args, kwargs=kwargs)


@event.listens_for(Session, "after_rollback")
def _drop_pending_tasks(session: Session) -> None:
    session.info.pop(_PENDING_TASKS, None)
