"""Drill: a burst of concurrent agents beyond what one API process takes at once (loopback only).

Excess requests must get a prompt 503 with Retry-After (the agent retries then, its batch safe in its
spool), never a timeout; latency stays bounded; `/healthz` still answers; every accepted batch is stored
once and no refused one at all.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.conftest import count
from tests.factories import batch
from tests.procs import running, wait_api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
MAX_IN_FLIGHT, AGENTS, ROUNDS = 4, 48, 3


async def _burst(url: str, token: str) -> tuple[list[tuple[int, float, str | None]], float]:
    """ROUNDS bursts of AGENTS concurrent batches, and how long /healthz took in the middle of one."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=AGENTS + 1)) as http:

        async def one(n: int) -> tuple[int, float, str | None]:
            started = time.monotonic()
            body = batch(f"gpu-node-{n:03d}", job_id="overload", gpus=8)
            response = await http.post("/api/v1/ingest", json=body, headers=headers)
            return response.status_code, time.monotonic() - started, response.headers.get("Retry-After")

        async def health() -> float:
            await asyncio.sleep(0.05)
            started = time.monotonic()
            assert (await http.get("/healthz")).status_code == 200
            return time.monotonic() - started

        answers: list[tuple[int, float, str | None]] = []
        health_s = 0.0
        for _ in range(ROUNDS):
            *got, health_s = await asyncio.gather(*(one(n) for n in range(AGENTS)), health())
            answers += got
        return answers, health_s


def test_excess_ingest_is_refused_promptly_with_retry_after(committed, tmp_path: Path) -> None:
    with Session(committed) as session:
        token = tokens.create(session, scope="agent").token
        session.commit()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"FAULTLINE_INGEST_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT)}
    with running(["faultline", "serve", "--port", str(port)], env=env, log=tmp_path / "api.log"):
        wait_api(url)
        answers, health_s = asyncio.run(_burst(url, token))
    codes = [code for code, _, _ in answers]
    latencies = sorted(seconds for _, seconds, _ in answers)
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    accepted, shed = codes.count(200), codes.count(503)
    print(
        f"{len(answers)} requests ({AGENTS} at once, {MAX_IN_FLIGHT} in flight allowed): {accepted} accepted, "
        f"{shed} refused 503; p50 {statistics.median(latencies):.2f} s, p99 {p99:.2f} s; /healthz {health_s:.2f} s"
    )
    assert set(codes) <= {200, 503} and accepted > 0 and shed > 0
    assert all(retry == "1" for code, _, retry in answers if code == 503)
    assert p99 < 10.0 and health_s < 5.0
    with Session(committed) as session:
        assert count(session, "agent_batches") == accepted  # refused batches left nothing behind
