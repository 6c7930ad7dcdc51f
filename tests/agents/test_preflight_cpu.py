"""`faultline preflight` for real, with PyTorch on the CPU: four processes on this host act as four nodes (gloo for
the control plane and the measurements); one of them is slowed (tests/fixtures/preflight_slow/: its every
all-reduce waits first, as a slow NIC makes every group it is in wait) and is named, and no other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.checks import collectives

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SLOWED = Path(__file__).resolve().parents[1] / "fixtures" / "preflight_slow"


def _node(rank: int, nnodes: int, port: int, *, slow: bool = False, deadline: float = 150) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAULTLINE_URL", "FAULTLINE_TOKEN")}
    if slow:
        env.update(PYTHONPATH=str(SLOWED), FAULTLINE_TEST_ALLREDUCE_DELAY_S="0.05")
    command = [
        sys.executable, "-m", "faultline", "preflight", "--backend", "gloo", "--node", f"cpu-{rank}", "--addr",
        "127.0.0.1", "--node-rank", str(rank), "--nnodes", str(nnodes), "--master-addr", "127.0.0.1",
        "--master-port", str(port), "--bytes", str(2**20), "--iters", "5", "--probe-timeout", "60", "--deadline",
        str(deadline), "--no-service", "--json",
    ]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_four_cpu_nodes_name_the_slowed_one_and_no_other():
    pytest.importorskip("torch")
    port = collectives.free_port()
    started = time.monotonic()
    procs = [_node(rank, 4, port, slow=rank == 2) for rank in range(4)]
    ended = [p.communicate(timeout=280) for p in procs]
    took = time.monotonic() - started
    outcomes = [json.loads(out) for out, _ in ended]
    for (_, err), p in zip(ended, procs, strict=True):
        assert p.returncode in (1, 3), err
    # The slowed node exits 1 (it is named), the others 3 (another node of the allocation is).
    assert [p.returncode for p in procs] == [3, 3, 1, 3]
    for outcome in outcomes:
        assert [(n["node"], n["shape"]) for n in outcome["named"]] == [("cpu-2", "slow")], outcome
        assert outcome["unresolved"] == [] and outcome["complete"]
    rounds = outcomes[0]["rounds"]
    assert [r["phase"] for r in rounds][:3] == ["local", "pairs", "bisect"]
    # Its own checks ran (the GEMM on the CPU), then pairs: its pair was slow, then it alone with a known-good node.
    assert all(g["verdict"] == "pass" and "gemm_tflops" in g["figures"] for g in rounds[0]["groups"])
    pairs = {tuple(g["nodes"]): g for g in rounds[1]["groups"]}
    assert pairs[("cpu-2", "cpu-3")]["verdict"] == "fail" and pairs[("cpu-0", "cpu-1")]["verdict"] == "pass"
    slowed = next(g for g in rounds[2]["groups"] if "cpu-2" in g["nodes"])
    assert slowed["verdict"] == "fail" and slowed["ref"] in ("cpu-0", "cpu-1")
    assert all(g["figures"]["latency_us"] > 0 for g in rounds[1]["groups"])
    print(f"4 CPU nodes: {took:.1f} s, {len(rounds)} rounds, {outcomes[0]['measurements']} measurements")


def test_a_node_that_never_comes_lets_the_job_start():
    pytest.importorskip("torch")
    started = time.monotonic()
    lonely = _node(0, 2, collectives.free_port(), deadline=8)
    _, err = lonely.communicate(timeout=120)
    assert lonely.returncode == 0, err
    assert "could not check this allocation" in err and "the job starts unchecked" in err
    assert time.monotonic() - started < 60


def test_the_group_measurement_adds_latency_and_an_all_to_all_whose_sums_are_checked():
    pytest.importorskip("torch")
    result = collectives.allreduce(
        "preflight_allreduce",
        nproc=2,
        backend="gloo",
        nbytes=2**16,
        iters=2,
        timeout=90,
        latency_iters=5,
        alltoall=True,
    )
    assert result.status == "pass", result.evidence
    assert result.evidence["latency_us"] > 0
    assert [r["wrong_elements"] for r in result.evidence["ranks"]] == [0, 0]
