"""A revoked token stops working on every API process within FAULTLINE_TOKEN_CACHE_SECONDS (each process
caches token lookups that long), with two real API processes that both had it cached."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.procs import running, wait_api

pytestmark = pytest.mark.slow
CACHE_S = 2.0


def test_revocation_reaches_every_api_process_within_the_cache_bound(committed, tmp_path: Path) -> None:
    with Session(committed) as session:
        made = tokens.create(session, scope="scheduler", name="to-revoke")
        session.commit()
        token_id = made.record.id
    headers = {"Authorization": f"Bearer {made.token}"}
    env = {"FAULTLINE_TOKEN_CACHE_SECONDS": str(CACHE_S)}
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with (
        running(["faultline", "serve", "--port", urls[0].rsplit(":", 1)[1]], env=env, log=tmp_path / "api-0.log"),
        running(["faultline", "serve", "--port", urls[1].rsplit(":", 1)[1]], env=env, log=tmp_path / "api-1.log"),
    ):
        for url in urls:
            wait_api(url)
            assert httpx.get(f"{url}/api/v1/decisions", headers=headers).status_code == 200  # now cached
        with Session(committed) as session:
            tokens.revoke(session, token_id=token_id)
            session.commit()
        revoked = time.monotonic()
        refused_after = {}
        while len(refused_after) < len(urls) and time.monotonic() - revoked < 30:
            for url in urls:
                if (
                    url not in refused_after
                    and httpx.get(f"{url}/api/v1/decisions", headers=headers).status_code == 401
                ):
                    refused_after[url] = time.monotonic() - revoked
            time.sleep(0.1)
    print(f"refused {', '.join(f'{s:.1f} s' for s in refused_after.values())} after revocation (bound {CACHE_S} s)")
    assert len(refused_after) == len(urls)
    assert max(refused_after.values()) <= CACHE_S + 1.0  # the bound, plus one poll and a loaded machine's slack
