"""What the simulated scheduler says about its machines: whether it would place work on each (what its adapter
loop reports back to the service) and where each one is, in the ground truth the service's node states are compared
with. The pure model, in milliseconds."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime

from lab.sim.actions import act
from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from lab.sim.scheduler import ClusterBackend

START = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _cluster(**kw: object) -> Cluster:
    config = SimConfig(nodes=2, gpus_per_node=2, scenario="healthy", seed=3, start=START)
    return Cluster(replace(config, spares=1, restart_seconds=2.0, repair_seconds=30.0, **kw))


def test_a_machine_is_schedulable_in_the_job_or_the_pool_and_not_in_repair_or_cordoned() -> None:
    c = _cluster()
    c.advance(5.0)
    assert [c.schedulable(m) for m in range(3)] == [True, True, True]
    act(c, {"kind": "evict", "node": "node-001"})
    assert not c.schedulable(1) and c.schedulable(2)  # in the shop; the spare took its node rank
    act(c, {"kind": "cordon", "node": "node-000"})
    assert c.place[0] == "job" and not c.schedulable(0)  # it keeps its ranks, nothing new goes there
    act(c, {"kind": "return", "node": "node-000"})
    assert c.schedulable(0)
    c.advance(40.0)  # repaired: back in the pool
    assert c.place[1] == "spare" and c.schedulable(1)


def test_the_ground_truth_says_where_each_machine_is_and_since_when() -> None:
    c = _cluster()
    c.advance(5.0)
    act(c, {"kind": "evict", "node": "node-001"})
    machines = c.ground_truth()["machines"]
    assert machines["node-001"] == {
        "place": "repair", "ranks": False, "cordoned": False, "since": 5.0,
        "since_at": "2026-11-01T12:00:05+00:00",
    }  # fmt: skip
    assert machines["node-002"]["ranks"] and machines["node-002"]["place"] == "job"
    assert machines["node-000"]["since_at"] == START.isoformat()  # never moved


def test_the_stand_ins_backend_answers_from_the_last_tick() -> None:
    c = _cluster()
    backend = ClusterBackend(threading.Event())
    assert backend.in_service("node-000") is None  # before the first tick: it cannot tell
    backend.serve(c)
    assert backend.in_service("node-000") is True and backend.in_service("elsewhere-7") is None
    act(c, {"kind": "evict", "node": "node-000"})
    backend.serve(c)
    assert backend.in_service("node-000") is False
