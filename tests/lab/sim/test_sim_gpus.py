"""A simulated node's check results come from the agent's real suite (agents/checks) run against the simulated
machine: fake NVML and PyTorch (lab/sim/fakegpu) answering from the machine's state the runner's GpuAnswers writes
(lab/sim/gpuanswers.py), the node's fake kernel tree for its ports and host, its kern.log for the Xids. The suite
runs in its own process with the simulated agent's paths, as under the runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.sim import gpustate
from lab.sim.actions import act
from lab.sim.config import SimConfig
from lab.sim.gpuanswers import ANSWER_TTL_S, GpuAnswers
from lab.sim.kerneltree import NodeTree, TreeWriter
from lab.sim.model import Cluster
from lab.sim.runner import FAKE_GPU_DIR, REPO_ROOT

START = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
SUITE = """
import json, sys
from agents.checks.suite import Options, run_suite
print(json.dumps({"results": [r.to_wire() for r in run_suite(Options(**json.loads(sys.argv[1])))]}))
"""


class Node:
    """One simulated machine with its kernel tree, kern.log and GPU answers, ticked as the runner ticks them."""

    def __init__(self, scenario: str, folder: Path, *, gpus: int = 4, check_seconds: float = 2.0) -> None:
        config = SimConfig(
            nodes=2, gpus_per_node=gpus, scenario=scenario, seed=7, fault_after=5.0, start=START, service_checks=True,
            check_seconds=check_seconds,
        )  # fmt: skip
        self.cluster = c = Cluster(config)
        lines = c.advance(40.0)
        m = c.faults[0].machine if c.faults else 0  # the faulty machine, or the first
        assert m is not None
        self.machine = m
        self.name = c.node_names[m]
        self.dir = folder / self.name
        self.dir.mkdir(parents=True)
        (self.dir / "kern.log").write_text(
            "".join(f"{x.text}\n" for x in lines if (x.node, x.stream) == (self.name, "kern"))
        )
        self.tree, self.writer = NodeTree(self.name, c.hosts[m], c.fabrics[m], c.gpus[m]), TreeWriter(self.dir)
        self.writer.sync(self.tree.files())
        self.said: list[str] = []
        self.answers = GpuAnswers(
            c, folder, check_seconds=check_seconds, sync_tree=lambda _: self.writer.sync(self.tree.files()),
            say=self.said.append,
        )  # fmt: skip

    @contextmanager
    def ticking(self) -> Iterator[None]:
        stop = threading.Event()
        started = time.monotonic()

        def loop() -> None:
            while not stop.is_set():
                self.answers.tick(time.monotonic() - started)
                stop.wait(0.1)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)

    def suite(self, **options: Any) -> dict[str, Any]:
        """The agent's suite on this node, in a process with the simulated agent's paths (lab/sim/runner.py)."""
        options = {
            "level": 2, "force": True, "sysfs_root": str(self.dir / "sys"), "procfs_root": str(self.dir / "proc"),
            "kernel_log": str(self.dir / "kern.log"), **options,
        }  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join((str(FAKE_GPU_DIR), str(REPO_ROOT))),
            "PATH": os.pathsep.join((str(FAKE_GPU_DIR / "bin"), os.environ["PATH"])),
            gpustate.ENV: str(self.answers.path(self.name)),
        }
        with self.ticking():
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-c", SUITE, json.dumps(options)], env=env, capture_output=True, text=True, timeout=120
            )
            took = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-3000:]
        return {**json.loads(done.stdout.splitlines()[-1]), "took": took}

    def state(self) -> dict[str, Any]:
        state = gpustate.read(self.answers.path(self.name))
        assert state is not None
        return state


def _by(results: list[dict[str, Any]], check: str) -> dict[str, dict[str, Any]]:
    return {r["subject"]: r for r in results if r["check"] == check}


def test_a_throttled_and_a_lost_gpu_are_measured_by_the_real_compute_check_after_the_check_time(
    tmp_path: Path,
) -> None:
    node = Node("straggler", tmp_path, check_seconds=2.0)
    c, m = node.cluster, node.machine
    [slow] = c.faults[0].gpus[node.name]
    lost = next(g.index for g in c.gpus[m] if g.index != slow)
    c.gpus[m][lost].lost = True
    assert act(c, {"kind": "diagnose", "node": node.name}).ack == "done"  # out for its checks
    ran = node.suite(only=["nvml_state", "host", "dcgm", "compute"])  # the all-reduce would wait for the lost rank
    results, state = ran["results"], node.state()
    assert state["done"] and ran["took"] >= 1.9  # the compute check waited for the machine's check time (2 s)
    assert any(f"{node.name}: its checks ran" in line for line in node.said), node.said
    nvml = _by(results, "nvml_state")
    assert "answers no NVML query" in nvml[f"gpu:{lost}"]["evidence"]["problems"][0]
    assert any("clocks held back" in p for p in nvml[f"gpu:{slow}"]["evidence"]["problems"])
    assert nvml[f"gpu:{slow}"]["evidence"]["uuid"] == c.gpus[m][slow].uuid
    assert _by(results, "dcgm")["node"]["status"] == "not_available"
    # CUDA no longer enumerates the lost GPU: the others are its ordinals 0..2, each measured at its own figure.
    visible = [g for g in state["gpus"] if not g["lost"]]
    gemm = _by(results, "gemm_bf16")
    assert sorted(gemm) == [f"gpu:{i}" for i in range(len(visible))]
    for ordinal, g in enumerate(visible):
        assert gemm[f"gpu:{ordinal}"]["measured"] == round(g["gemm_tflops"], 2)
        assert _by(results, "memory_bandwidth")[f"gpu:{ordinal}"]["measured"] == round(g["memory_gbps"], 2)
        assert _by(results, "h2d_bandwidth")[f"gpu:{ordinal}"]["measured"] == round(g["h2d_gbps"], 2)
    throttled = gemm[f"gpu:{[g['index'] for g in visible].index(slow)}"]
    assert throttled["status"] == "fail" and throttled["measured"] < 0.8 * throttled["evidence"]["node_median"]
    assert {r["status"] for r in _by(results, "numerics").values()} == {"pass"}


def test_a_flapping_port_grows_its_counters_under_the_checks_and_the_real_port_watch_sees_it(tmp_path: Path) -> None:
    node = Node("ib_port_flap", tmp_path)
    [flapping] = node.cluster.faults[0].gpus[node.name]
    results = node.suite()["results"]
    ports = _by(results, "ib_port")
    problems = ports[f"ib:mlx5_{flapping}/1"]["evidence"]["problems"]
    assert ports[f"ib:mlx5_{flapping}/1"]["status"] == "fail" and "link_downed +1" in problems[0]
    assert {s for s, r in ports.items() if r["status"] == "fail"} == {f"ib:mlx5_{flapping}/1"}
    [allreduce] = _by(results, "allreduce_node").values()  # four ranks over the fake NCCL, at the node's figure
    assert allreduce["status"] == "pass" and allreduce["measured"] == round(node.state()["allreduce_busbw_gbps"], 2)
    assert [r["wrong_elements"] for r in allreduce["evidence"]["ranks"]] == [0, 0, 0, 0]


def test_a_hung_gsp_asks_for_a_reset_and_its_xid_comes_from_the_node_s_kern_log(tmp_path: Path) -> None:
    node = Node("gsp_error", tmp_path)
    [gpu] = node.cluster.faults[0].gpus[node.name]
    results = _by(node.suite(level=1)["results"], "nvml_state")
    hung = results[f"gpu:{gpu}"]
    assert hung["status"] == "fail" and hung["evidence"]["action"] == "reset_gpu"
    assert hung["evidence"]["problems"] == ["the driver asks for a GPU reset"]
    assert [x["xid"] for x in hung["evidence"]["xid_since_boot"]] == [node.cluster.gpus[node.machine][gpu].xid]
    assert {s for s, r in results.items() if r["status"] == "fail"} == {f"gpu:{gpu}"}


def test_an_answer_lasts_while_the_machine_stays_and_its_check_time_runs_from_when_it_went_out(
    tmp_path: Path,
) -> None:
    node = Node("healthy", tmp_path, check_seconds=30.0)
    answers, path = node.answers, node.answers.path(node.name)
    asked = gpustate.asked_path(path)
    answers.tick(0.0)
    asked.touch()  # a spare's checks (the service's, between jobs): answered at once
    answers.tick(1.0)
    assert node.state()["done"] and not asked.exists()
    answers.tick(1.0 + ANSWER_TTL_S + 1)  # the suite that asked is long over: its next checks get a fresh answer
    assert not path.exists()
    assert act(node.cluster, {"kind": "diagnose", "node": node.name}).ack == "done"
    answers.tick(100.0)  # out for its checks from now
    asked.touch()
    answers.tick(110.0)
    assert not node.state()["done"]  # the fake GPUs' measurements wait...
    answers.tick(129.0)
    assert not node.state()["done"]
    answers.tick(130.0)  # ...until its check time is over
    assert node.state()["done"] and any(f"{node.name}: its checks ran" in line for line in node.said)
    assert act(node.cluster, {"kind": "return", "node": node.name}).ack == "done"
    answers.tick(131.0)
    assert not path.exists()  # back in the pool: its next checks get a fresh answer
