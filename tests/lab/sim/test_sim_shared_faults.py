"""Shared-component faults in the simulator (lab/sim/shared_faults.py): where each machine sits, what a leaf switch
down, a bad driver rollout, a storage outage and a rack's power loss show on every machine of the component (read
with the agent's own parsers and collectors), the ground truth that blames the component, and the repair."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lab.evaluation.soak_agent import VirtualAgent
from lab.sim.config import SimConfig
from lab.sim.host import DRIVER_VERSION
from lab.sim.mix import SHARED_CATEGORY, draws
from lab.sim.model import Cluster
from lab.sim.scenarios import FAULT_KINDS, SHARED_FAULT_KINDS, FaultSpec
from lab.sim.shared_faults import ROLLOUT_LEAD_S, rollout_driver, topology

START = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def _cluster() -> Cluster:
    config = SimConfig(
        nodes=4, gpus_per_node=2, spares=2, scenario="healthy", seed=5, start=START, node_prefix="c-job0-", agents=False
    )
    cluster = Cluster(config)
    for t in range(1, 21):
        cluster.advance(float(t))
    return cluster


def _agents(cluster: Cluster, tmp_path: Path) -> list[VirtualAgent]:
    agents = [
        VirtualAgent(cluster, n, job_id="j", tree_dir=tmp_path, pid_base=100_000) for n in range(cluster.machines)
    ]
    for a in agents:
        a.start(START)
    return agents


def _batches(cluster: Cluster, agents: list[VirtualAgent], until: float) -> list[dict]:
    t = cluster.t
    while t < until:
        t += 1.0
        lines = cluster.advance(t)
        for a in agents:
            a.read_lines([line for line in lines if line.node == a.name], START + timedelta(seconds=t))
    out = [a.batch(START + timedelta(seconds=t)) for a in agents]
    return [b for b in out if b is not None]


def test_topology_places_four_machines_per_switch_rack_and_power_domain() -> None:
    assert topology("c-job0-", 0) == {
        "rack": "c-job0-rack-0",
        "switch": "c-job0-leaf-0",
        "power_domain": "c-job0-pdu-0",
        "storage_mounts": ["/mnt/datasets/c-job0"],
    }
    assert topology("c-job0-", 3)["switch"] == "c-job0-leaf-0" and topology("c-job0-", 4)["switch"] == "c-job0-leaf-1"


def test_the_agents_report_their_place_and_versions(tmp_path: Path) -> None:
    cluster = _cluster()
    (batch, *_) = _batches(cluster, _agents(cluster, tmp_path), 22.0)
    host = batch["heartbeat"]["host"]
    assert (host["rack"], host["switch"], host["power_domain"]) == ("c-job0-rack-0", "c-job0-leaf-0", "c-job0-pdu-0")
    assert host["storage_mounts"] == ["/mnt/datasets/c-job0"]
    assert host["driver_version"] == DRIVER_VERSION


@pytest.mark.parametrize("kind", SHARED_FAULT_KINDS)
def test_each_shared_fault_blames_its_component_and_hits_every_member(kind: str, tmp_path: Path) -> None:
    cluster = _cluster()
    agents = _agents(cluster, tmp_path)
    assert FAULT_KINDS[kind].expect_action == "cordon" and not FAULT_KINDS[kind].expect_eviction
    assert cluster.component_fault_ready(kind)
    record = cluster.inject(FaultSpec(cluster.t, kind))
    assert record.nodes == [f"c-job0-{i:03d}" for i in range(4)]  # the job's machines, all in pod 0
    expected = {
        "switch_down": ("switch", "c-job0-leaf-0"),
        "driver_rollout": ("driver", rollout_driver("c-job0-")),
        "storage_outage": ("storage", "/mnt/datasets/c-job0"),
        "rack_power_loss": ("power_domain", "c-job0-pdu-0"),
    }[kind]
    assert (record.details["component_kind"], record.details["component"]) == expected
    if kind == "driver_rollout":  # installed first: the agents report the new version before anything fails
        installed = {b["node"]: b for b in _batches(cluster, agents, cluster.t + ROLLOUT_LEAD_S - 5.0)}
        for node in record.nodes:
            assert installed[node]["heartbeat"]["host"]["driver_version"] == rollout_driver("c-job0-")
            assert not [e for e in installed[node]["logs"] if e["kind"] == "xid"]
        assert cluster.job.state == "running"
    onset = cluster.t + (5.0 if kind == "driver_rollout" else 0.0)
    batches = {b["node"]: b for b in _batches(cluster, agents, onset + 3.0)}
    if kind == "driver_rollout":
        assert abs(record.t - onset) <= 1.0  # the fault's time is the GSP's failure, not the install
    for node in record.nodes:
        kinds = [e["kind"] for e in batches[node]["logs"]]
        if kind == "switch_down":
            assert "nccl_ib_error" in kinds or any("ib" in k for k in kinds), kinds
        elif kind == "driver_rollout":
            assert batches[node]["heartbeat"]["host"]["driver_version"] == rollout_driver("c-job0-")
            assert {e["fields"]["xid"] for e in batches[node]["logs"] if e["kind"] == "xid"} == {119}
        elif kind == "storage_outage":
            io = [e for e in batches[node]["logs"] if e["kind"] == "traceback"]
            assert io and all("[Errno 5] Input/output error: '/mnt/datasets/c-job0/" in e["line"] for e in io), io
        else:
            assert {e["fields"]["xid"] for e in batches[node]["logs"] if e["kind"] == "xid"} == {79}
    for spare in ("c-job0-004", "c-job0-005"):  # no job there: nothing to fail
        assert not [e for e in batches[spare]["logs"] if e["severity"] in ("error", "critical")]
    assert cluster.job.state in ("failed", "hung")
    cluster.repair(record)
    assert cluster.job.state == "running"
    assert {h.driver_version for h in cluster.hosts} == {DRIVER_VERSION}
    assert all(not g.lost for gpus in cluster.gpus for g in gpus)


def test_a_switch_fault_needs_three_of_the_jobs_machines_behind_one_switch() -> None:
    cluster = _cluster()
    cluster.slots = [2, 3, 4, 5]  # the job moved half onto the spares: two machines behind each switch
    assert not cluster.component_fault_ready("switch_down")
    assert cluster.component_fault_ready("storage_outage")


def test_the_campaign_draws_shared_faults_at_its_rate_in_turn_and_leaves_the_others_where_they_were() -> None:
    plain = [next(s) for s in [draws(11, nodes=4, gpus_per_node=2)] for _ in range(300)]
    stream = draws(11, nodes=4, gpus_per_node=2, shared_rate=0.1)
    mixed = [next(stream) for _ in range(300)]
    shared = [d for d in mixed if d.category == SHARED_CATEGORY]
    assert 15 <= len(shared) <= 45
    assert [d.kind for d in shared[:4]] == list(SHARED_FAULT_KINDS)
    assert all(m == p for m, p in zip(mixed, plain, strict=True) if m.category != SHARED_CATEGORY)


def test_each_clusters_rollout_installs_a_build_of_its_own() -> None:
    """The campaign's jobs' clusters (prefixes by job) roll out different builds: their rollouts never share a label."""
    builds = {rollout_driver(f"camp{run:05d}{job}-") for run in (12345, 36703) for job in "ab"}
    assert len(builds) == 4 and all(b.startswith("570.86.") for b in builds)
    assert rollout_driver("c-job0-") == rollout_driver("c-job0-")


def test_the_virtual_agent_watches_its_ports_every_second_as_the_agent_does(tmp_path: Path) -> None:
    """A port that goes down is a critical `port_down` event at the next sample, not at the next ship tick."""
    cluster = _cluster()
    agents = _agents(cluster, tmp_path)
    _batches(cluster, agents, 22.0)  # a ship tick: the ports found
    now = START + timedelta(seconds=23)
    agents[1].sample(now, cluster.snapshot()[agents[1].name])
    assert not agents[1].has_critical()
    cluster.fabrics[1].flap_down(0, random.Random(1))
    for a in agents:
        a.sample(now, cluster.snapshot()[a.name])
    assert [i for i, a in enumerate(agents) if a.has_critical()] == [1]
    batch = agents[1].batch(now, urgent=True)
    assert batch is not None
    (event,) = [e for e in batch["logs"] if e["kind"] == "port_down"]
    assert event["fields"]["state"] == 1 and event["fields"]["port"].startswith("ib:mlx5_")
