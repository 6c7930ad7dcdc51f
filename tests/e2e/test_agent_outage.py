"""A real agent shipping to the real API: the service stopped for a minute, the agent killed meanwhile.

Nothing may be lost and nothing stored twice: every step line written to the training log ends up as
exactly one event, and every GPU sample at most once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.procs import running, wait_api, wait_for
from tests.receiver import receiver

pytestmark = pytest.mark.slow
OUTAGE_S = float(os.environ.get("FAULTLINE_TEST_OUTAGE_S", "60"))
GPUS = 8


def _exporter_page(scrape: int) -> bytes:
    """A dcgm-exporter page: the scrape count in a counter, so each scrape's samples differ."""
    return "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",Hostname="n1"}} {90 + g}\n'
        f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{g}",UUID="GPU-{g}",Hostname="n1"}} {scrape * 1000}\n'
        for g in range(GPUS)
    ).encode()


def _write_steps(path: Path, stop: threading.Event, written: list[int]) -> None:
    with path.open("a", buffering=1) as f:
        while not stop.is_set():
            written[0] += 1
            f.write(f"step={written[0]} loss={2.0 - written[0] * 1e-4:.4f} grad_norm=1.00\n")
            time.sleep(0.1)


def test_service_down_for_a_minute_and_agent_killed_loses_and_duplicates_nothing(committed, tmp_path: Path) -> None:
    with Session(committed) as session:
        token = tokens.create(session, scope="agent", node_name="n1").token
        session.commit()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log, spool = tmp_path / "train.log", tmp_path / "spool"
    log.touch()
    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_write_steps, args=(log, stop, written))
    serve = ["faultline", "serve", "--port", str(port)]
    with receiver() as dcgm:
        dcgm.page = _exporter_page
        agent_args = [
            # Two samples per GPU in every batch: the service must store each sample, and a killed agent's
            # unshipped samples must come back from its journal, once.
            "faultline", "agent", "--server", url, "--node-name", "n1", "--sample-interval", "0.5",
            "--ship-interval", "1", "--dcgm-url", f"{dcgm.url}/metrics", "--kmsg", "none", "--log", str(log),
            "--spool-dir", str(spool),
        ]  # fmt: skip
        env = {"FAULTLINE_AGENT_TOKEN": token}
        with running(serve, log=tmp_path / "api-1.log") as api:
            wait_api(url)
            with running(agent_args, env=env, log=tmp_path / "agent-1.log") as agent:
                # A new agent starts at the end of existing logs; write once it follows the file.
                wait_for(lambda: "for node n1" in (tmp_path / "agent-1.log").read_text(), what="the agent")
                writer.start()
                wait_for(lambda: _count(committed, "log_events") >= 20, what="events stored")
                api.send_signal(signal.SIGKILL)  # the service dies mid-stream
                api.wait()
                time.sleep(OUTAGE_S / 2)
                assert len(list(spool.glob("*.batch"))) >= OUTAGE_S / 2 - 5, (
                    "the agent spools while the service is down"
                )
                agent.send_signal(signal.SIGKILL)  # and the agent itself dies with a full spool
                agent.wait()
        with running(agent_args, env=env, log=tmp_path / "agent-2.log") as agent:
            time.sleep(OUTAGE_S / 2)
            with running(serve, log=tmp_path / "api-2.log"):
                wait_api(url)
                wait_for(lambda: not list(spool.glob("*.batch")), timeout=120, what="the spool to drain")
                stop.set()
                writer.join()
                agent.send_signal(signal.SIGTERM)  # a clean stop ships what is left
                agent.wait(timeout=30)
                assert agent.returncode == 0
            agent_log = (tmp_path / "agent-1.log").read_text()
            assert "cannot ship" in agent_log, agent_log[-2000:]
            assert "replaying them first" in (tmp_path / "agent-2.log").read_text()

    with committed.connect() as conn:
        steps = conn.execute(
            text("SELECT (fields->>'step')::int FROM log_events WHERE kind = 'step' ORDER BY 1")
        ).scalars()
        assert list(steps) == list(range(1, written[0] + 1))  # every line once, none lost, none twice
        rows, distinct = conn.execute(text("SELECT count(*), count(DISTINCT (ts, gpu)) FROM metric_samples")).one()
        assert rows == distinct  # no sample stored twice
        # Every scrape's samples are stored, except at most the one the kill cut between reading and journaling.
        assert GPUS * (dcgm.gets - 1) <= rows <= GPUS * dcgm.gets
        assert dcgm.gets >= OUTAGE_S  # the agent went on collecting while the service was down


def _count(engine: Any, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_wrong_token_stops_the_agent_with_a_clear_message(committed, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"):
        wait_api(url)
        args = ["faultline", "agent", "--server", url, "--token", "fl_wrong", "--kmsg", "none", "--interval", "0.5",
                "--spool-dir", str(tmp_path / "spool")]  # fmt: skip
        with running(args, log=tmp_path / "agent.log") as agent:
            agent.wait(timeout=30)
        assert agent.returncode == 3
        assert "refused this agent's token (401" in (tmp_path / "agent.log").read_text()


def _spooled_batch_ids(spool: Path) -> set[str]:
    import gzip
    import json

    return {json.loads(gzip.decompress(path.read_bytes()))["batch_id"] for path in spool.glob("*.batch")}


def test_sigterm_with_the_service_silent_exits_within_2_s_and_a_restart_ships_the_spool_once(
    committed, tmp_path: Path
) -> None:
    """The worst unreachable service: it accepts connections and never answers, so a POST hangs."""
    import socket

    with Session(committed) as session:
        token = tokens.create(session, scope="agent", node_name="n2").token
        session.commit()
    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # the kernel accepts; nobody ever answers
    spool = tmp_path / "spool"
    env = {"FAULTLINE_AGENT_TOKEN": token}
    with receiver() as dcgm, silent:
        dcgm.page = _exporter_page

        def agent_args(server: str) -> list[str]:
            return ["faultline", "agent", "--server", server, "--node-name", "n2", "--sample-interval", "0.5",
                    "--ship-interval", "0.5", "--dcgm-url", f"{dcgm.url}/metrics", "--kmsg", "none",
                    "--spool-dir", str(spool)]  # fmt: skip

        with running(agent_args(f"http://127.0.0.1:{silent.getsockname()[1]}"), env=env, log=tmp_path / "a1.log") as a:
            wait_for(lambda: len(list(spool.glob("*.batch"))) >= 3, what="batches spooled for the silent service")
            signalled = time.monotonic()
            a.send_signal(signal.SIGTERM)
            a.wait(timeout=30)
            took = time.monotonic() - signalled
        assert a.returncode == 0, (tmp_path / "a1.log").read_text()[-2000:]
        print(f"stopped {took:.2f} s after SIGTERM with {len(list(spool.glob('*.batch')))} batches spooled")
        assert took < 2.0, f"the agent took {took:.1f} s to stop"
        spooled = _spooled_batch_ids(spool)
        assert len(spooled) >= 3 and "stay in the spool" in (tmp_path / "a1.log").read_text()

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"):
            wait_api(url)
            with running(agent_args(url), env=env, log=tmp_path / "a2.log"):
                wait_for(lambda: spooled <= _stored_batches(committed), timeout=60, what="the spool shipped")
    with committed.connect() as conn:
        rows, distinct = conn.execute(text("SELECT count(*), count(DISTINCT (ts, gpu)) FROM metric_samples")).one()
    assert rows == distinct > 0  # the spooled batches' samples stored once each


def _stored_batches(engine: Any) -> set[str]:
    with engine.connect() as conn:
        return {str(b) for b in conn.execute(text("SELECT batch_id FROM agent_batches")).scalars()}
