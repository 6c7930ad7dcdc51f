"""A real Celery worker runs tasks enqueued in a transaction only after it commits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from service.db import enqueue_after_commit
from service.maintenance import tasks
from tests.procs import running, wait_for, wait_worker_ready

pytestmark = pytest.mark.slow

OLD = datetime.now(UTC) - timedelta(days=400)


def _insert_old_sample(conn, node_id: int) -> None:
    conn.execute(text("INSERT INTO metric_samples (ts, node_id, gpu) VALUES (:ts, :n, 0)"), {"ts": OLD, "n": node_id})


def _old_samples(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM metric_samples WHERE ts = :ts"), {"ts": OLD}).scalar_one()


def test_task_runs_after_commit_and_never_after_rollback(committed, redis_url, tmp_path):
    factory = sessionmaker(bind=committed)
    broker = redis.Redis.from_url(redis_url)
    # Beat-scheduled tasks (decision expiry every 10 s) left by earlier tests that ran beat: not this test's.
    broker.delete("maintenance")
    with running(["faultline", "work", "--concurrency", "1"], log=tmp_path / "worker.log"):
        wait_worker_ready()
        with factory() as session:
            _insert_old_sample(session, 1)
            enqueue_after_commit(session, tasks.prune_old_signals)
            assert broker.llen("maintenance") == 0, "sent before the commit"
            session.commit()
        wait_for(lambda: _old_samples(committed) == 0, what="the worker to prune the old sample")

        with committed.begin() as conn:
            _insert_old_sample(conn, 2)
        with factory() as session:
            enqueue_after_commit(session, tasks.prune_old_signals)
            session.rollback()
        time.sleep(2)  # the worker is up and idle: a task sent by mistake would run now
        assert broker.llen("maintenance") == 0
        assert _old_samples(committed) == 1, "a task enqueued in a rolled-back transaction ran"


def test_a_worker_and_the_api_each_load_the_hooks_their_domains_register(database_url, redis_url):
    # A closed decision resolves its incident (and a diagnose one sends the stop-time checks), and maintenance
    # prunes the UI's sessions, through hooks the upper domains register when imported: the processes that run
    # them must import those domains. Fresh interpreters, as a worker or an API process starts.
    decided = (
        "from service.decisions import lifecycle; "
        "hooks = sorted(h.__name__ for h in lifecycle._after_finish); "
        "assert hooks == ['_checks_after_diagnose', '_resolve_after_decision'], hooks"
    )
    pruned = "from service.maintenance import service as m; assert 'ui_sessions' in m._pruners, m._pruners"
    env = {**os.environ, "FAULTLINE_DATABASE_URL": database_url, "FAULTLINE_REDIS_URL": redis_url}
    for code in (
        f"from service.worker import celery_app; celery_app.loader.import_default_modules(); {decided}; {pruned}",
        f"from service.app import create_app; from service.config import get_settings; create_app(get_settings()); "
        f"{decided}",
    ):
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
