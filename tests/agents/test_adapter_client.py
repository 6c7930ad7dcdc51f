"""The adapters' API client and shared loop, against scripted HTTP answers (httpx.MockTransport)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from agents.schedulers.client import AuthFailed, FaultlineClient, GaveUp
from agents.schedulers.loop import ActionFailed, AdapterLoop, LoopOptions, scheduler_node

Handler = Callable[[httpx.Request], httpx.Response]


def _decision(decision_id: int, kind: str = "evict", node: str | None = "gpu-01", **extra: Any) -> dict[str, Any]:
    return {"id": decision_id, "kind": kind, "node": node, "state": "pending", "reason": f"reason {decision_id}",
            "expires_at": None, **extra}  # fmt: skip


def _page(items: list[dict[str, Any]], cursor: str | None = None) -> httpx.Response:
    return httpx.Response(200, json={"items": items, "next_cursor": cursor})


def _client(handler: Handler, **kwargs: Any) -> tuple[FaultlineClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    kwargs.setdefault("max_backoff_s", 0.01)
    return FaultlineClient("http://faultline.test", "fl_token", transport=httpx.MockTransport(record), **kwargs), seen


def test_pending_asks_for_every_node_kind_at_once_follows_cursors_and_returns_oldest_first() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("cursor") is None:
            return _page([_decision(9), _decision(8, "return"), _decision(7)], "c1")
        return _page([_decision(3)])

    client, seen = _client(handler)
    assert [d["id"] for d in client.pending()] == [3, 7, 8, 9]
    assert all(r.url.params.get_list("kind") == ["evict", "cordon", "return", "reset_gpu"] for r in seen)
    assert all(r.url.params["state"] == "pending" and "wait" not in r.url.params for r in seen)
    assert seen[0].headers["authorization"] == "Bearer fl_token"


def test_pending_long_polls_only_the_first_page() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("cursor") is None:
            return _page([_decision(4, "return")], "c1")
        return _page([_decision(2)])

    client, seen = _client(handler)
    assert [d["id"] for d in client.pending(wait_s=30)] == [2, 4]
    assert [r.url.params.get("wait") for r in seen] == ["30", None]


def test_an_outage_is_retried_with_one_line_when_it_starts_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = [httpx.Response(503, json={"message": "database unavailable"}, headers={"Retry-After": "0"})] * 3

    def handler(request: httpx.Request) -> httpx.Response:
        if answers:
            return answers.pop()
        return _page([_decision(1)])

    client, seen = _client(handler)
    with caplog.at_level(logging.INFO, logger="agents.schedulers.client"):
        assert [d["id"] for d in client.pending()] == [1]
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "unavailable" in m]) == 1
    assert len([m for m in messages if "reachable again" in m and "3 failed attempts" in m]) == 1
    assert len(seen) == 3 + 1


def test_connection_errors_give_up_only_when_patience_runs_out() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client, seen = _client(handler, patience_s=0.2)
    with pytest.raises(GaveUp):
        client.pending()
    assert len(seen) > 1


def test_a_refused_token_raises_auth_failed_without_retrying() -> None:
    client, seen = _client(lambda _r: httpx.Response(401, json={"message": "invalid token"}))
    with pytest.raises(AuthFailed, match="invalid token"):
        client.pending()
    assert len(seen) == 1


def test_an_ack_answered_409_is_final_and_not_retried() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": "conflict", "message": "decision 5 expired"})

    client, seen = _client(handler)
    result = client.ack(5, "done", "cordoned")
    assert (result.delivered, result.status, result.message) == (False, 409, "decision 5 expired")
    assert len(seen) == 1
    assert orjson.loads(seen[0].content) == {"outcome": "done", "message": "cordoned"}


class _Backend:
    name = "Fake"

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.fail_on = fail_on

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        return self._act("take_out", node, decision)

    def put_back(self, node: str, decision: Mapping[str, Any]) -> str:
        return self._act("put_back", node, decision)

    def _act(self, action: str, node: str, decision: Mapping[str, Any]) -> str:
        self.calls.append((action, node, int(decision["id"])))
        if node == self.fail_on:
            raise ActionFailed(f"cannot reach {node}")
        return f"{action} {node}"


def _serve(decisions: list[dict[str, Any]], acks: dict[int, dict[str, Any]]) -> Handler:
    """Pending decisions until acknowledged; acks recorded."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            decision_id = int(request.url.path.split("/")[-2])
            acks[decision_id] = orjson.loads(request.content)
            return httpx.Response(200, json={"id": decision_id})
        kinds = request.url.params.get_list("kind")
        return _page([d for d in decisions if d["kind"] in kinds and d["id"] not in acks])

    return handler


def test_the_loop_acts_in_decision_order_and_acks_failures_with_their_message() -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    decisions = [
        _decision(6, "return", "gpu-01.example.com"),
        _decision(5, "evict", "gpu-01.example.com"),
        _decision(7, "cordon", "gpu-02.example.com"),
        _decision(8, "evict", None),
        _decision(9, "evict", "gpu-03", expires_at=past),
    ]
    acks: dict[int, dict[str, Any]] = {}
    client, _ = _client(_serve(decisions, acks))
    backend = _Backend(fail_on="gpu-02")
    loop = AdapterLoop(client, backend, LoopOptions(wait_s=0, once=True, strip_domain=True))
    assert loop.run() == 0
    # Oldest first: the node is evicted, then returned, ending in service as the newest decision wants.
    assert backend.calls == [("take_out", "gpu-01", 5), ("put_back", "gpu-01", 6), ("take_out", "gpu-02", 7)]
    assert acks[5] == {"outcome": "done", "message": "take_out gpu-01"}
    assert acks[6] == {"outcome": "done", "message": "put_back gpu-01"}
    assert acks[7] == {"outcome": "failed", "message": "cannot reach gpu-02"}
    assert acks[8] == {"outcome": "failed", "message": "evict decision names no node"}
    assert 9 not in acks  # expired: neither acted on nor acknowledged


def test_a_held_ack_survives_an_outage_and_is_delivered_before_anything_new() -> None:
    decisions = [_decision(1)]
    acks: dict[int, dict[str, Any]] = {}
    serve = _serve(decisions, acks)
    down = [True, True]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and down:
            down.pop()
            raise httpx.ConnectError("connection refused", request=request)
        return serve(request)

    client, seen = _client(handler)
    backend = _Backend()
    assert AdapterLoop(client, backend, LoopOptions(wait_s=0, once=True)).run() == 0
    assert backend.calls == [("take_out", "gpu-01", 1)]  # acted once, acked after two failed tries
    assert acks == {1: {"outcome": "done", "message": "take_out gpu-01"}}
    assert [r.method for r in seen].count("POST") == 3


def test_strip_domain_keeps_addresses_whole() -> None:
    assert scheduler_node("gpu-01.example.com", strip_domain=True) == "gpu-01"
    assert scheduler_node("gpu-01.example.com", strip_domain=False) == "gpu-01.example.com"
    assert scheduler_node("10.0.3.7", strip_domain=True) == "10.0.3.7"
