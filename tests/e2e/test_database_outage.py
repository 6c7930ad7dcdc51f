"""With its database stopped for 30 s, the real API answers 503 (so agents retry), and the API, worker and
beat recover by themselves: nothing lost, nothing doubled, and diagnosis decides again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from service import migrate
from service.config import to_sqlalchemy_url
from service.embedded import start_postgres
from service.tokens import service as tokens
from tests.factories import batch
from tests.procs import api_server, running, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
OUTAGE_S = float(os.environ.get("FAULTLINE_TEST_DB_OUTAGE_S", "30"))


def _postmaster_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    return int(pidfile.read_text().splitlines()[0]) if pidfile.exists() else None


def _stop_postgres(pgdata: Path) -> None:
    pid = _postmaster_pid(pgdata)
    assert pid is not None
    os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
    wait_for(lambda: not (pgdata / "postmaster.pid").exists(), what="PostgreSQL to stop")


def test_ingest_answers_503_while_the_database_is_down_and_recovers(tmp_path):
    pg = start_postgres(tmp_path)
    pgdata = tmp_path / "postgres"
    try:
        migrate.upgrade(to_sqlalchemy_url(pg.url))
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        engine = create_engine(to_sqlalchemy_url(pg.url))
        with Session(engine) as session:
            token = tokens.create(session, scope="agent").token
            session.commit()
        engine.dispose()
        env = {"FAULTLINE_DATABASE_URL": pg.url, "FAULTLINE_TOKEN_CACHE_SECONDS": "0"}
        with (
            api_server(env, log=tmp_path / "api.log") as url,
            running(["faultline", "work", "--queues", "diagnosis"], env=env, log=tmp_path / "worker.log"),
            running(["faultline", "work", "--beat-only"], env=env, log=tmp_path / "beat.log"),
        ):
            headers = {"Authorization": f"Bearer {token}"}
            assert httpx.post(f"{url}/api/v1/ingest", json=batch(logs=[]), headers=headers).status_code == 200

            _stop_postgres(pgdata)
            held_back = batch()
            response = httpx.post(f"{url}/api/v1/ingest", json=held_back, headers=headers, timeout=30)
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"]
            assert response.json()["error"] == "unavailable"
            health = httpx.get(f"{url}/healthz", timeout=30)
            assert health.status_code == 503
            assert health.json()["database"].startswith("error") and health.json()["broker"] == "ok"

            time.sleep(OUTAGE_S)  # the worker's and beat's passes fail meanwhile
            pg.server.ensure_postgres_running()  # same folder, same socket: no process was told anything

            def delivered() -> bool:
                r = httpx.post(f"{url}/api/v1/ingest", json=held_back, headers=headers, timeout=30)
                return r.status_code == 200

            wait_for(delivered, timeout=30, what="ingest to recover")
            assert httpx.get(f"{url}/healthz").status_code == 200
            again = httpx.post(f"{url}/api/v1/ingest", json=held_back, headers=headers)
            assert again.json()["status"] == "duplicate"

            def decided() -> bool:  # the worker and beat came back without a restart
                with psycopg.connect(pg.url) as conn:
                    return conn.execute("SELECT count(*) FROM decisions WHERE kind = 'evict'").fetchone() == (1,)

            wait_for(decided, timeout=60, what="the held-back Xid decided by the recovered worker")
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("SELECT count(*) FROM agent_batches").fetchone() == (2,)
            assert conn.execute("SELECT count(*) FROM metric_samples").fetchone() == (4,)
            assert conn.execute("SELECT count(*) FROM incidents").fetchone() == (1,)
    finally:
        pg.stop()
