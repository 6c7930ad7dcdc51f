"""`faultline sim preflight`: the product's preflight search over a simulated 64-node allocation with a slow NIC, a GPU
below its fleet criterion and a broken pair link planted names the three (four nodes) and no healthy one, within
the modelled deadline and well under the 3-minute wall-time target."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lab.sim.preflight import Allocation, plant, run


def test_the_command_names_the_three_faults_and_no_healthy_node():
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "sim", "preflight", "--json"], capture_output=True, text=True, timeout=180
    )
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    planted = set(out["planted"]["slow_nic"]) | set(out["planted"]["slow_gpu"]) | set(out["planted"]["broken_pair"][0])
    assert len(planted) == 4 and set(out["named"]) == planted
    assert out["healthy_named"] == [] and out["missed"] == [] and out["all_named_and_no_healthy"]
    assert out["outcome"]["complete"] and out["modelled_preflight_s"] <= 180
    shapes = {n["node"]: n["shape"] for n in out["outcome"]["named"]}
    assert shapes[out["planted"]["slow_nic"][0]] == "slow"
    assert shapes[next(iter(out["planted"]["slow_gpu"]))] == "local"
    assert {shapes[n] for n in out["planted"]["broken_pair"][0]} == {"pair"}
    assert out["measurements"] < 64 * 63 // 2 // 10 and out["rounds"] <= 25
    assert wall < 180


@pytest.mark.parametrize("seed", range(20))
def test_every_placement_of_the_faults_is_found_within_the_deadline(seed):
    alloc = plant(64, seed=seed)
    outcome, fabric, _ = run(alloc)
    assert set(outcome.bad) == alloc.planted, (seed, [(n.node, n.shape, n.why) for n in outcome.named])
    assert outcome.complete and fabric.clock_s <= 180


def test_the_gpu_is_below_the_fleets_cutoff_but_within_its_nodes_median():
    # The node's own median check (15%) passes it: only the fleet's criterion (ml/check_criteria.py) fails it.
    alloc = plant(16, seed=1)
    outcome, _, floor = run(alloc)
    [gpu_node] = alloc.slow_gpu
    local = next(n for n in outcome.named if n.node == gpu_node)
    assert local.shape == "local" and "fleet" in local.why
    assert 700 < floor < 790


def test_a_tight_deadline_stops_the_search_and_names_no_healthy_node():
    alloc = plant(64, seed=2)
    outcome, fabric, _ = run(alloc, deadline_s=60)
    assert not outcome.complete
    assert set(outcome.bad) <= alloc.planted
    assert fabric.clock_s <= 60


def test_a_healthy_allocation_names_nobody():
    alloc = Allocation([f"node-{i:03d}" for i in range(64)], seed=5)
    outcome, fabric, _ = run(alloc)
    assert outcome.named == [] and outcome.unresolved == [] and outcome.complete
    assert len(outcome.rounds) == 7 and fabric.clock_s < 90
