"""The agent's spool and shipper against a local receiver: order, retries, refusals, restarts."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.shipper import REFUSED_ATTEMPTS, Shipper
from agents.spool import Spool
from tests.procs import wait_for
from tests.receiver import Receiver, receiver


def _put(spool: Spool, n: int, *, metrics: int = 8) -> None:
    body = gzip.compress(orjson.dumps({"n": n, "metrics": [{}] * metrics}))
    spool.put(body, {"metrics": metrics, "logs": 1, "stacks": 0, "processes": 0})


def _shipper(spool: Spool, rx: Receiver, directives: list[Any] | None = None) -> Shipper:
    return Shipper(
        spool,
        server=rx.url,
        token="fl_test",
        on_directives=(directives.extend if directives is not None else lambda _d: None),
        max_backoff=0.2,
    )


def test_spool_survives_a_restart_and_replays_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**9, max_batches=1000)
    for n in range(5):
        _put(spool, n)
    (tmp_path / "0000000000000099-1-0-0-0.tmp").write_bytes(b"half a batch")  # a write cut by a crash

    reopened = Spool(tmp_path, max_bytes=10**9, max_batches=1000)
    assert len(reopened) == 5
    assert not list(tmp_path.glob("*.tmp"))
    with receiver() as rx:
        shipper = _shipper(reopened, rx)
        assert shipper.drain(timeout=10)
    assert [b["n"] for b in rx.bodies()] == [0, 1, 2, 3, 4]
    assert rx.requests[0]["headers"]["Authorization"] == "Bearer fl_test"
    _put(reopened, 5)
    assert reopened.peek(0) is not None and reopened.peek(0).seq == 6  # numbering goes on after a restart


def test_full_spool_drops_oldest_and_counts_what_it_dropped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**9, max_batches=3)
    for n in range(5):
        _put(spool, n, metrics=8)
    assert len(spool) == 3
    assert spool.dropped == {"metrics": 16, "logs": 2, "batches": 2}
    assert orjson.loads(gzip.decompress(spool.peek(0).read()))["n"] == 2  # type: ignore[union-attr]

    by_bytes = Spool(tmp_path / "b", max_bytes=1, max_batches=1000)
    for n in range(3):
        _put(by_bytes, n)
    assert len(by_bytes) == 1  # the newest batch is always kept
    assert by_bytes.dropped["batches"] == 2


def test_retries_5xx_429_and_network_errors_in_order_honouring_retry_after(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**9, max_batches=1000)
    for n in range(3):
        _put(spool, n)
    with receiver() as rx:
        rx.script = [
            (503, {"message": "database unavailable"}, {"Retry-After": "0.1"}),
            (429, {"message": "slow down"}, {}),
            (500, {"message": "boom"}, {}),
        ]
        assert _shipper(spool, rx).drain(timeout=20)
    # The first batch was tried four times and then everything went through in order, once each.
    assert [b["n"] for b in rx.bodies()] == [0, 0, 0, 0, 1, 2]

    dead = Spool(tmp_path / "dead", max_bytes=10**9, max_batches=1000)
    _put(dead, 0)
    unreachable = Shipper(dead, server="http://127.0.0.1:9", token="t", on_directives=lambda _d: None, max_backoff=0.1)
    assert not unreachable.drain(timeout=1.0)
    assert len(dead) == 1 and unreachable.failures >= 2  # kept for later, nothing dropped
    assert not dead.dropped


def test_a_refused_batch_is_dropped_after_a_few_tries_and_does_not_block_the_rest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**9, max_batches=1000)
    for n in range(2):
        _put(spool, n)
    with receiver() as rx:
        rx.script = [(422, {"message": "bad field"}, {})] * REFUSED_ATTEMPTS
        assert _shipper(spool, rx).drain(timeout=20)
    assert [b["n"] for b in rx.bodies()] == [0] * REFUSED_ATTEMPTS + [1]
    assert spool.dropped == {"metrics": 8, "logs": 1, "batches": 1}


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_stops_shipping_with_a_clear_message_and_keeps_the_spool(tmp_path: Path, status: int) -> None:
    spool = Spool(tmp_path, max_bytes=10**9, max_batches=1000)
    _put(spool, 0)
    with receiver() as rx:
        rx.default = (status, {"message": "unknown token"}, {})
        shipper = _shipper(spool, rx)
        thread = threading.Thread(target=shipper.run, daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert len(rx.requests) == 1
    assert shipper.auth_error is not None
    assert f"({status}: unknown token)" in shipper.auth_error and "--token" in shipper.auth_error
    assert len(spool) == 1


def test_directives_in_answers_reach_the_agent(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**9, max_batches=1000)
    got: list[Any] = []
    with receiver() as rx:
        rx.default = (200, {"directives": [{"id": "d1", "kind": "dump_stacks", "job_id": "j"}]}, {})
        shipper = _shipper(spool, rx, got)
        thread = threading.Thread(target=shipper.run, daemon=True)
        thread.start()
        _put(spool, 0)
        wait_for(lambda: bool(got), timeout=10, what="directives")
        shipper.stopping.set()
        thread.join(timeout=5)
    assert got == [{"id": "d1", "kind": "dump_stacks", "job_id": "j"}]
    assert len(spool) == 0
