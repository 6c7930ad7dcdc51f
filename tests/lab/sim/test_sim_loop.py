"""The closed loop in the simulated cluster (lab/sim/actions.py, pool.py): evict and diagnose swap a spare in
and restart the job from its checkpoint on new processes, reset_gpu resets the GPU, machines come back from
repair or a check, and a job with no spare waits for one. The pure model, in milliseconds."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from lab.sim.actions import act
from lab.sim.config import SimConfig
from lab.sim.gpu import COMPUTE, IDLE
from lab.sim.model import Cluster
from lab.sim.modes import NORMAL, TERMINATED
from lab.sim.scenarios import FaultSpec

START = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def cluster(scenario: str = "gpu_lost", *, spares: int = 1, seed: int = 5, **kw: object) -> Cluster:
    config = SimConfig(nodes=3, gpus_per_node=4, scenario=scenario, seed=seed, fault_after=10.0, start=START)
    return Cluster(replace(config, spares=spares, **kw))


def faulty(c: Cluster) -> tuple[str, int]:
    f = c.faults[0]
    return f.nodes[0], f.machine if f.machine is not None else -1


def test_without_spares_the_cluster_is_the_job_alone() -> None:
    c = cluster(spares=0)
    c.advance(60.0)
    assert c.node_names == ["node-000", "node-001", "node-002"] and c.pool == []
    assert "loop" not in c.ground_truth() and "spares" not in c.ground_truth()


def test_evict_swaps_a_spare_in_and_restarts_from_the_checkpoint_with_new_processes() -> None:
    c = cluster(restart_seconds=15.0, repair_seconds=300.0)
    c.advance(45.0)  # the GPU fell off the bus, the watchdog fired, the job died
    assert c.job.state == "failed"
    name, machine = faulty(c)
    slot = c.node_rank(machine)
    assert slot is not None
    generation, checkpoint = c.generation, c.job.last_checkpoint

    outcome = act(c, {"kind": "evict", "node": name})

    assert outcome.ack == "done" and outcome.rank_map_changed and "node-003 swapped in" in outcome.message
    # What happens, in the order it happens, and which checkpoint it goes back to (issue 40).
    assert outcome.message.endswith(f"node-003 swapped in as node rank {slot}; the job restarts from its checkpoint "
                                    f"at step {checkpoint}")  # fmt: skip
    assert c.slots[slot] == 3 and c.place[machine] == "repair" and c.pool == []
    assert c.ranks_on(machine) == [] and c.ranks_on(3) == list(range(slot * 4, slot * 4 + 4))
    assert {r["node"] for r in c.rank_map() if r["rank"] // 4 == slot} == {"node-003"}
    assert all(m == TERMINATED for m in c.modes)  # torchrun stopped every rank
    assert c.faults[0].left_job_at is not None and c.faults[0].resolved_by == "evict"
    assert c.faults[0].repaired_at is None  # still broken, in the shop
    loop = c.ground_truth()["loop"]
    assert [(e["kind"], e["node"]) for e in loop] == [
        ("restart", c.config.job_id),
        ("swap_out", name),
        ("to_repair", name),
        ("swap_in", "node-003"),
    ]

    c.advance(45.0 + 15.0 + 10.0)  # down, then the checkpoint's load
    assert c.generation == generation + 1 and c.job.state == "running" and c.modes == [NORMAL] * c.world
    steps = [s for s, t, _ in c.step_history if t > 45.0]
    assert steps and min(steps) == checkpoint + 1  # the steps since the checkpoint are trained again
    assert c.control_text(3).splitlines()[:2] == [f"generation {c.generation}", f"node_rank {slot}"]
    assert len(c.control_text(3).splitlines()) == 2 + 4
    assert c.control_text(machine).splitlines() == [f"generation {c.generation}", "node_rank -"]  # no ranks

    c.advance(45.0 + 300.0 + 1.0)
    assert c.place[machine] == "spare" and c.pool == [machine]
    assert c.faults[0].repaired_at is not None
    assert all(not g.lost for g in c.gpus[machine])
    assert act(c, {"kind": "evict", "node": name}).message.endswith("(repair)")  # a spare: out of the pool


def test_an_evicted_node_evicted_again_changes_nothing() -> None:
    c = cluster()
    c.advance(45.0)
    name, _ = faulty(c)
    act(c, {"kind": "evict", "node": name})
    slots, restarts = list(c.slots), c.restarts
    again = act(c, {"kind": "evict", "node": name})
    assert again.ack == "done" and not again.rank_map_changed and "already out" in again.message
    assert c.slots == slots and c.restarts == restarts


def test_without_a_spare_the_job_waits_for_the_repaired_node() -> None:
    c = cluster(spares=0, repair_seconds=100.0, restart_seconds=10.0)
    c.advance(45.0)
    name, machine = faulty(c)
    outcome = act(c, {"kind": "evict", "node": name})
    assert "waiting for a spare" in outcome.message and not outcome.rank_map_changed
    # Not "restarting": without a spare the job cannot restart, and the message says it stays stopped until one is.
    assert "restarting" not in outcome.message
    assert "the job stays stopped until one is, then restarts from its checkpoint at step" in outcome.message
    c.advance(140.0)
    assert c.job.pause == "restart" and c.generation == 0  # nobody to run its node rank
    version = c.slots_version
    c.advance(160.0)  # repaired at 145 s, back in its own node rank, then the restart
    assert c.slots_version == version + 1 and c.place[machine] == "job"
    assert c.job.state == "running" and c.generation == 1


def test_diagnose_checks_the_node_and_repairs_it_only_when_it_carries_a_fault() -> None:
    c = cluster(spares=2, check_seconds=30.0, repair_seconds=200.0)
    c.advance(45.0)
    name, machine = faulty(c)
    healthy = next(m for m in c.slots if m != machine)
    assert act(c, {"kind": "diagnose", "node": name}).ack == "done"
    assert act(c, {"kind": "diagnose", "node": c.node_names[healthy]}).ack == "done"
    assert c.place[machine] == c.place[healthy] == "check" and sorted(c.slots) == sorted({*c.slots})
    assert c.faults[0].resolved_by == "diagnose"
    c.advance(80.0)
    assert c.place[healthy] == "spare" and c.place[machine] == "repair"  # the check found its fault
    c.advance(300.0)
    assert c.place[machine] == "spare"


def test_reset_gpu_clears_a_gsp_fault_and_restarts_the_ranks_on_the_same_machines() -> None:
    c = cluster("gpu_reset", restart_seconds=5.0)
    c.advance(45.0)
    f = c.faults[0]
    name, gpu = f.nodes[0], f.gpus[f.nodes[0]][0]
    slots, generation = list(c.slots), c.generation
    outcome = act(c, {"kind": "reset_gpu", "node": name, "gpu": gpu})
    assert outcome.ack == "done" and not outcome.rank_map_changed
    assert f.repaired_at is not None and f.resolved_by == "reset_gpu" and f.left_job_at is None
    assert c.gpus[f.machine or 0][gpu].xid == 0
    c.advance(70.0)
    assert c.slots == slots and c.generation == generation + 1 and c.job.state == "running"


@pytest.mark.parametrize(
    ("decision", "error"),
    [
        ({"kind": "evict", "node": "node-999"}, "no node node-999"),
        ({"kind": "evict"}, "names no node"),
        ({"kind": "reset_gpu", "node": "node-000", "gpu": 9}, "names no GPU"),
        ({"kind": "reset_gpu", "node": "node-000", "gpu": True}, "names no GPU"),
        ({"kind": "restart", "node": "node-000"}, "does not act on restart"),
    ],
)
def test_bad_decisions_fail_and_change_nothing(decision: dict[str, object], error: str) -> None:
    c = cluster()
    c.advance(20.0)
    before = (list(c.slots), dict(c.place), c.restarts, c.generation)
    outcome = act(c, decision)
    assert outcome.ack == "failed" and error in outcome.message
    assert (list(c.slots), dict(c.place), c.restarts, c.generation) == before


def test_cordon_and_return_move_a_spare_out_of_the_pool_and_back() -> None:
    c = cluster("healthy")
    assert act(c, {"kind": "cordon", "node": "node-003"}).ack == "done"
    assert c.pool == [] and c.place[3] == "cordoned"
    assert act(c, {"kind": "return", "node": "node-003"}).ack == "done"
    assert c.pool == [3]
    act(c, {"kind": "evict", "node": "node-000"})
    refused = act(c, {"kind": "return", "node": "node-000"})
    assert refused.ack == "failed" and "repair" in refused.message


def test_spares_report_idle_gpus_and_no_ranks() -> None:
    c = cluster("healthy")
    c.advance(20.0)
    snap = c.snapshot()
    assert set(snap) == {"node-000", "node-001", "node-002", "node-003"}
    assert all(s.values["DCGM_FI_DEV_GPU_UTIL"] == 0 for s in snap["node-003"])
    assert all(s.values["DCGM_FI_DEV_GPU_UTIL"] > 0 for s in snap["node-000"])
    gt = c.ground_truth()
    assert gt["spares"] == ["node-003"] and gt["job_nodes"] == ["node-000", "node-001", "node-002"]


def test_a_planned_fault_on_a_node_rank_waiting_for_a_spare_lands_when_a_machine_fills_it() -> None:
    """The 30-minute demo crashed (KeyError) injecting its next fault into a node rank the loop had emptied."""
    c = cluster(spares=0, repair_seconds=100.0, restart_seconds=10.0)
    c.advance(45.0)
    name, _ = faulty(c)
    act(c, {"kind": "evict", "node": name})
    vacant = next(iter(c.vacant))
    # The plan's next fault names that node rank (the demo draws node ranks uniformly).
    c._next_fault = FaultSpec(c.t + 5.0, "gpu_lost", vacant, 1, repair_at=c.t + 200.0)
    c.advance(c.t + 30.0)
    assert len(c.faults) == 1, "nothing to inject into while the rank is empty"
    c.advance(160.0)  # repaired at 145 s, back in its node rank
    assert len(c.faults) == 2 and c.faults[1].nodes == [c.node_names[c.slots[vacant]]]


def test_with_service_checks_a_node_in_its_check_waits_for_the_services_verdict() -> None:
    c = cluster(spares=3, service_checks=True, check_wait_seconds=600.0, repair_seconds=200.0)
    c.advance(45.0)
    name, machine = faulty(c)
    healthy = [m for m in c.slots if m != machine][:2]
    for m in (machine, *healthy):
        assert act(c, {"kind": "diagnose", "node": c.node_names[m]}).ack == "done"
    c.advance(300.0)  # past the placeholder's check_seconds: nothing settles without the service
    assert [c.place[m] for m in (machine, *healthy)] == ["check"] * 3
    evicted = act(c, {"kind": "evict", "node": name})  # the service's verdict on failing checks
    assert evicted.ack == "done" and "failed its checks" in evicted.message and c.place[machine] == "repair"
    returned = act(c, {"kind": "return", "node": c.node_names[healthy[0]]})  # on a clean pass
    assert returned.ack == "done" and c.place[healthy[0]] == "spare"
    c.advance(700.0)  # nobody answered the last one's checks: a person looks (healthy: back to the pool)
    assert c.place[healthy[1]] == "spare" and c.place[machine] == "spare"  # repaired meanwhile


def test_a_runaway_loader_ends_with_the_machines_part_of_the_job_and_never_follows_it_into_the_next() -> None:
    """The campaign's false accusation: a machine diagnosed for a runaway loader passed its check (the machine is
    healthy, the loader was the job's), went back to the pool, and when a spare was needed again its GPUs still
    waited for input every step, and it was diagnosed again."""
    c = cluster("software_slow", spares=2, service_checks=True, check_wait_seconds=600.0, restart_seconds=5.0)
    c.advance(45.0)
    name, machine = faulty(c)
    assert c.loader_wait.get(machine) and c.hosts[machine].hog, "the fault is on"
    assert act(c, {"kind": "diagnose", "node": name}).ack == "done"
    assert machine not in c.loader_wait and not c.hosts[machine].hog
    assert act(c, {"kind": "return", "node": name}).ack == "done" and c.place[machine] == "spare"
    # Another machine leaves; the returned one takes its node rank (or the other spare does, then this one next).
    for other in [m for m in list(c.slots) if m != machine][:2]:
        act(c, {"kind": "evict", "node": c.node_names[other]})
        if machine in c.slots:
            break
    assert machine in c.slots, "back in the job"
    c.advance(45.0 + 60.0)
    assert c.job.state == "running" and not c.job.pause
    ranks = c.ranks_on(machine)
    seen = set()
    for _ in range(40):  # a few steps' phases
        c.advance(c.t + 0.25)
        seen |= {c.activity(r) for r in ranks}
    assert IDLE not in seen and COMPUTE in seen, seen
