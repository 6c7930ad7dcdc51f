"""A simulated NVL72 tray's GPUs' fabric info as its agent reads it beside dcgm-exporter: the agent's own NVML code
(agents/nvml_fabric.py) in a process with the simulated node's fake NVML first on its path (lab/sim/fakegpu), as the
runner starts it, answering from the node's live inventory (lab/sim/gpuanswers.py) without asking for a check's
state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.sim import gpustate
from lab.sim.config import SimConfig
from lab.sim.gpuanswers import GpuAnswers
from lab.sim.model import Cluster
from lab.sim.runner import FAKE_GPU_DIR, REPO_ROOT

START = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
READ = """
import json
from agents.nvml_fabric import open_exporter_fabric
fabric = open_exporter_fabric()
if fabric is None:
    print(json.dumps(None))
else:
    fabric.read()
    print(json.dumps({"fabric": fabric.fabric, "open": fabric.supported}))
"""


def _read(state: Path) -> Any:
    env = {
        **os.environ,
        gpustate.ENV: str(state),
        "PYTHONPATH": os.pathsep.join((str(FAKE_GPU_DIR), str(REPO_ROOT))),
    }
    done = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _node(tmp_path: Path, scenario: str) -> tuple[Cluster, GpuAnswers, Path]:
    cluster = Cluster(SimConfig(nodes=4, scenario=scenario, seed=3, fault_after=5.0, start=START))
    for name in cluster.node_names:
        (tmp_path / name).mkdir()
    answers = GpuAnswers(cluster, tmp_path, check_seconds=1.0, sync_tree=lambda _: None, say=lambda _: None)
    return cluster, answers, tmp_path / cluster.node_names[1] / gpustate.STATE_FILE


def test_a_trays_fabric_is_read_live_from_the_racks_state_and_nothing_is_asked(tmp_path: Path) -> None:
    cluster, answers, state = _node(tmp_path, "nvswitch_tray_failure")
    assert cluster.nvl72 is not None
    before = _read(state)
    assert before["open"] and len(before["fabric"]) == 4
    assert {(f["cluster_uuid"], f["health"], f["degraded_bw"]) for f in before["fabric"].values()} == {
        (cluster.nvl72.cluster_uuid, "healthy", False)
    }
    cluster.advance(10.0)  # the switch tray fails at 5 s
    answers.write_inventories()
    after = _read(state)
    assert {(f["health"], f["degraded_bw"], f["gfm"]) for f in after["fabric"].values()} == {
        ("limited_capacity", True, "connected")
    }
    # Only what NVML answers without measuring was asked: no check state requested from the runner.
    assert not state.exists() and not gpustate.asked_path(state).exists()


def test_a_node_in_no_nvlink_fabric_reports_none_and_lets_nvml_go(tmp_path: Path) -> None:
    _, _, state = _node(tmp_path, "healthy")  # an HGX H100 node: its GPUs answer NotSupported
    assert _read(state) == {"fabric": {}, "open": False}
    assert not state.exists() and not gpustate.asked_path(state).exists()
