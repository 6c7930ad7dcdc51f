"""Drill: Redis (the broker) stops for 20 s while agents ship, and a fatal Xid arrives during the outage.

Ingest must go on storing (the broker is only for tasks), answer promptly, and the Xid must be decided
after Redis returns, by the periodic pass at the latest, exactly once; the API, worker and beat recover
without a restart.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from service.embedded import free_port, start_redis
from service.tokens import service as tokens
from tests.conftest import count
from tests.factories import batch
from tests.procs import running, wait_api, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
OUTAGE_S = float(os.environ.get("FAULTLINE_TEST_REDIS_OUTAGE_S", "20"))


def test_broker_down_for_20_s_loses_no_batch_and_no_critical_event(committed, tmp_path: Path) -> None:
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent").token
        scheduler = tokens.create(session, scope="scheduler").token
        session.commit()
    redis_port = free_port()
    broker = start_redis(tmp_path, port=redis_port)
    env = {"FAULTLINE_REDIS_URL": broker.url}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, timeout=30)
    try:
        with (
            running(["faultline", "serve", "--port", str(port)], env=env, log=tmp_path / "api.log"),
            running(["faultline", "work", "--queues", "diagnosis"], env=env, log=tmp_path / "worker.log"),
            running(["faultline", "work", "--beat-only"], env=env, log=tmp_path / "beat.log"),
        ):
            wait_api(url)
            ship = {"Authorization": f"Bearer {agent}"}
            first = batch("gpu-node-011", job_id="redis-drill", logs=[])
            assert http.post("/api/v1/ingest", json=first, headers=ship).status_code == 200

            broker.process.send_signal(signal.SIGKILL)
            broker.process.wait()
            with Session(committed) as session:
                before = count(session, "log_events")
            started = time.monotonic()
            during = http.post("/api/v1/ingest", json=batch("gpu-node-011", job_id="redis-drill"), headers=ship)
            took = time.monotonic() - started
            assert during.status_code == 200, during.text
            with Session(committed) as session:
                assert count(session, "log_events") == before + 1  # the Xid is stored while the broker is gone
            print(f"ingest answered {took:.2f} s into the broker outage")
            assert took < 5.0

            time.sleep(OUTAGE_S)
            broker = start_redis(tmp_path, port=redis_port)
            back = time.monotonic()

            def decided() -> list[dict]:
                page = http.get(
                    "/api/v1/decisions", params={"job": "redis-drill"}, headers={"Authorization": f"Bearer {scheduler}"}
                )
                return page.json()["items"] if page.status_code == 200 else []

            wait_for(lambda: bool(decided()), timeout=90, what="the Xid decided after the broker returned")
            print(f"decided {time.monotonic() - back:.1f} s after the broker returned")
            time.sleep(10)
            (decision,) = decided()
            assert decision["kind"] == "evict" and decision["node"] == "gpu-node-011"
            assert http.get("/healthz").json()["broker"] == "ok"
    finally:
        http.close()
        broker.stop()
