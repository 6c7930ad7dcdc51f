"""Adapters report a node's return the same way: the shared loop lists the nodes faultline holds out of service,
asks its scheduler which of them it has in service again, and reports each with one call
(POST /api/v1/nodes/NAME/return). Against scripted HTTP answers and the backends' fakes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agents.schedulers.client import FaultlineClient
from agents.schedulers.loop import ActionFailed, AdapterLoop, LoopOptions
from agents.schedulers.slurm import SlurmBackend, node_in_service
from tests.fakes.scontrol import fake_scontrol


class _Service:
    """Nodes by state, the returns reported, and pending decisions (none unless given)."""

    def __init__(self, held: dict[str, list[str]], refuse: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.held = held
        self.refuse = refuse
        self.reported: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "GET" and path == "/api/v1/nodes":
            names = self.held.get(request.url.params["state"], [])
            return httpx.Response(200, json={"items": [{"name": n} for n in names], "next_cursor": None})
        if request.method == "POST" and path.endswith("/return"):
            node = path.split("/")[-2]
            if node in self.refuse:
                return httpx.Response(409, json={"error": "conflict", "message": f"{node} has a cordon waiting"})
            self.reported.append((node, orjson.loads(request.content)))
            return httpx.Response(200, json={"name": node, "state": "returning"})
        return httpx.Response(200, json={"items": [], "next_cursor": None})  # pending decisions: none


class _Backend:
    name = "Fake"

    def __init__(self, states: dict[str, bool | Exception | None]) -> None:
        self.states = states
        self.asked: list[str] = []

    def in_service(self, node: str) -> bool | None:
        self.asked.append(node)
        state = self.states.get(node)
        if isinstance(state, Exception):
            raise state
        return state

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        raise AssertionError("nothing to act on")

    put_back = take_out


def _loop(service: _Service, backend: Any, **options: Any) -> AdapterLoop:
    client = FaultlineClient("http://faultline.test", "fl_token", transport=httpx.MockTransport(service))
    return AdapterLoop(client, backend, LoopOptions(wait_s=0, once=True, **options))


def test_the_loop_reports_the_nodes_its_scheduler_has_back_in_service() -> None:
    service = _Service(
        {
            "evicted": ["gpu-01.example.com", "gpu-02.example.com", "other-cluster-07"],
            "cordoned": ["gpu-03.example.com"],
            "in_repair": ["gpu-04.example.com", "gpu-05.example.com"],
        },
        refuse={"gpu-05.example.com"},
    )
    backend = _Backend(
        {
            "gpu-01": True,  # resumed after its repair
            "gpu-02": False,  # still drained
            "gpu-03": True,
            "gpu-04": ActionFailed("scontrol timed out"),
            "gpu-05": True,  # but a cordon for it still waits on this adapter: the service says 409
        }
    )
    loop = _loop(service, backend, strip_domain=True)
    assert loop.run() == 0
    assert sorted(backend.asked) == ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "other-cluster-07"]
    assert service.reported == [
        ("gpu-01.example.com", {"reason": "schedulable again in Fake"}),
        ("gpu-03.example.com", {"reason": "schedulable again in Fake"}),
    ]
    assert loop.returns_reported == 2
    lists = [r for r in service.requests if r.url.path == "/api/v1/nodes"]
    assert sorted(r.url.params["state"] for r in lists) == ["cordoned", "evicted", "in_repair"]


def test_a_dry_run_reports_nothing_and_zero_turns_the_watch_off() -> None:
    service = _Service({"evicted": ["gpu-01"]})
    assert _loop(service, _Backend({"gpu-01": True}), dry_run=True).run() == 0
    assert service.reported == []
    off = _Service({"evicted": ["gpu-01"]})
    assert _loop(off, _Backend({"gpu-01": True}), returns_every_s=0).run() == 0
    assert not [r for r in off.requests if r.url.path == "/api/v1/nodes"]


def test_while_nodes_are_held_out_the_long_poll_is_no_longer_than_the_watch_interval() -> None:
    service = _Service({"evicted": ["gpu-01"]})
    client = FaultlineClient("http://faultline.test", "fl_token", transport=httpx.MockTransport(service))
    loop = AdapterLoop(client, _Backend({"gpu-01": False}), LoopOptions(wait_s=30, returns_every_s=5))
    loop.round()
    [poll] = [r for r in service.requests if r.url.path == "/api/v1/decisions"]
    assert poll.url.params["wait"] == "5"
    # The next round within the interval does not list the nodes again.
    loop.round()
    assert len([r for r in service.requests if r.url.path == "/api/v1/nodes"]) == 3


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        ("NodeName=gpu-01 State=IDLE+DRAIN ThreadsPerCore=2", False),
        ("NodeName=gpu-01 State=MIXED+DRAIN ThreadsPerCore=2", False),
        ("NodeName=gpu-01 State=DOWN* ThreadsPerCore=2", False),
        ("NodeName=gpu-01 State=IDLE+MAINT+RESERVED", False),
        ("NodeName=gpu-01 State=IDLE~", False),
        ("NodeName=gpu-01 State=IDLE ThreadsPerCore=2", True),
        ("NodeName=gpu-01 State=ALLOCATED ThreadsPerCore=2", True),
        ("NodeName=gpu-01 State=MIXED+RESERVED", True),
        ("NodeName=gpu-01 Arch=x86_64", None),
    ],
)
def test_slurm_reads_whether_a_node_takes_jobs_from_its_state(shown: str, expected: bool | None) -> None:
    assert node_in_service(shown) is expected


def test_slurm_asks_scontrol_and_a_node_it_lacks_is_none(tmp_path: Path) -> None:
    scontrol = fake_scontrol(tmp_path)
    backend = SlurmBackend(str(scontrol.path))
    assert backend.in_service("gpu-09") is None
    backend.take_out("gpu-09", {"id": 4, "kind": "evict", "reason": "Xid 79"})
    assert backend.in_service("gpu-09") is False
    scontrol.set_state("gpu-09", "IDLE")  # an admin resumed it after the repair
    assert backend.in_service("gpu-09") is True
    assert scontrol.calls()[-1] == ["show", "node", "-o", "gpu-09"]
    scontrol.fail_with("slurm_load_node error: Unable to contact slurm controller\n")
    with pytest.raises(ActionFailed, match="Unable to contact"):
        backend.in_service("gpu-09")
