"""Killing the API process mid-stream loses no batch and stores none twice.

The API answers only after a batch is committed, and batch ids are idempotency keys, so an agent
that re-sends every batch it has no 200 for gets exactly-once storage.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.factories import batch
from tests.procs import running, wait_api, wait_for

pytestmark = pytest.mark.slow
BATCHES = 150


def _ship_all(url: str, token: str, payloads: list[dict], sent: list[int]) -> None:
    """What an agent does: keep re-sending a batch until the service acknowledges it."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=5) as client:
        for payload in payloads:
            while True:
                try:
                    if client.post("/api/v1/ingest", json=payload).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            sent[0] += 1


def test_sigkill_of_the_api_loses_and_duplicates_nothing(committed, tmp_path):
    with Session(committed) as session:
        token = tokens.create(session, scope="agent").token
        session.commit()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["faultline", "serve", "--port", str(port)]
    payloads = [batch(f"node-{i % 4}", gpus=8) for i in range(BATCHES)]
    sent = [0]
    shipper = threading.Thread(target=_ship_all, args=(url, token, payloads, sent))
    with running(serve, log=tmp_path / "api-1.log") as first:
        wait_api(url)
        shipper.start()
        wait_for(lambda: sent[0] >= BATCHES // 3, what="a third of the batches")
        first.send_signal(signal.SIGKILL)
        first.wait()
    killed_at = sent[0]
    assert killed_at < BATCHES
    with running(serve, log=tmp_path / "api-2.log"):
        shipper.join(timeout=120)
        assert not shipper.is_alive()
    with committed.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM agent_batches")).scalar_one() == BATCHES
        assert conn.execute(text("SELECT count(*) FROM metric_samples")).scalar_one() == BATCHES * 8
        assert conn.execute(text("SELECT count(*) FROM log_events")).scalar_one() == BATCHES
