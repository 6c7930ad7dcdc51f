"""The beat's task in a real Celery worker: a window within its lead time drains its node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import text

from service.worker import celery_app
from tests.procs import running, wait_for

pytestmark = pytest.mark.slow


def _state(engine, name: str) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM nodes WHERE name = :n"), {"n": name}).scalar_one()
        cordons = conn.execute(
            text(
                "SELECT count(*) FROM decisions d JOIN nodes n ON n.id = d.node_id "
                "WHERE n.name = :n AND d.kind = 'cordon'"
            ),
            {"n": name},
        ).scalar_one()
    return state, cordons


def test_a_worker_drains_a_node_ahead_of_its_window(committed, redis_url, tmp_path) -> None:
    redis.Redis.from_url(redis_url).delete("maintenance")  # tasks other tests' beats left
    now = datetime.now(UTC)
    with committed.begin() as conn:
        node_id = conn.execute(text("INSERT INTO nodes (name) VALUES ('worker-mw-1') RETURNING id")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO maintenance_windows (node_id, starts_at, ends_at, reason, source, author) "
                "VALUES (:n, :s, :e, 'rack PDU swap', 'operator', 'operator:alice')"
            ),
            {"n": node_id, "s": now + timedelta(minutes=5), "e": now + timedelta(hours=1)},
        )
    with running(["faultline", "work", "--concurrency", "1"], log=tmp_path / "worker.log"):
        celery_app.send_task("maintenance.planned_windows")
        wait_for(lambda: _state(committed, "worker-mw-1") == ("cordoned", 1), timeout=60, what="the drain")
    with committed.connect() as conn:
        prepared = conn.execute(text("SELECT prepared_at IS NOT NULL FROM maintenance_windows")).scalar_one()
        silences = conn.execute(text("SELECT count(*) FROM silences WHERE node_pattern = 'worker-mw-1'")).scalar_one()
    assert prepared and silences == 1
    with committed.begin() as conn:
        conn.execute(text("DELETE FROM silences"))  # not among the tables `committed` empties
