"""The simulated cluster: the pure model (determinism, exporter format, each scenario's signature,
ground truth) in milliseconds, then two short real runs (rank processes, py-spy stacks, shutdown)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab.sim import cli
from lab.sim.config import SimConfig
from lab.sim.dcgm_fields import FIELDS, INT64_NOT_SUPPORTED
from lab.sim.exporter import MetricsServer, render
from lab.sim.gpu import GpuSample
from lab.sim.model import Cluster
from lab.sim.modes import CRASH_USER, CULPRIT_DATA, VICTIM
from lab.sim.scenarios import HARDWARE_FAULTS, SCENARIOS
from tests import paths

Snapshot = dict[str, list[GpuSample]]
OnSample = Callable[[float, Snapshot], None]
T_ = TypeVar("T_")
START = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)
T = 10.0  # fault_after in the model tests
W = 20.0  # default watchdog
ERROR_WORDS = ("Xid", "WARN", "Error", "error", "Traceback", "Watchdog", "FAILED")


class Recorder:
    """Advances a cluster in small increments, keeping every line with the time it was written."""

    def __init__(self, scenario: str, *, nodes: int = 3, gpus: int = 4, seed: int = 11, fault_every: float = 120.0):
        config = SimConfig(nodes=nodes, gpus_per_node=gpus, scenario=scenario, seed=seed, fault_after=T, start=START)
        self.c = Cluster(replace(config, fault_every=fault_every))
        self.lines: list[tuple[float, str, str, str]] = []  # (t, node, stream, text)

    def run(self, until: float, every: float = 0.5, on_sample: OnSample | None = None) -> None:
        t = self.c.t
        while t < until - 1e-9:
            t = min(until, t + every)
            for line in self.c.advance(t):
                self.lines.append((t, line.node, line.stream, line.text))
            if on_sample:
                on_sample(t, self.c.snapshot())

    def text(self, node: str | None = None, stream: str | None = None, after: float = -1, before: float = 1e9) -> str:
        return "\n".join(
            x for t, n, s, x in self.lines if (node in (None, n)) and (stream in (None, s)) and after <= t < before
        )

    def step_times(self) -> list[float]:
        return [t for t, n, s, x in self.lines if s == "train" and n == "node-000" and "step=" in x]

    def values(self, node: str, gpu: int) -> dict[str, float] | None:
        """The GPU's current DCGM values; None once its series have vanished."""
        for g in self.c.snapshot()[node]:
            if g.index == gpu:
                return g.values
        return None

    def value(self, node: str, gpu: int, field: str) -> float:
        values = self.values(node, gpu)
        assert values is not None, f"{node} gpu {gpu} has no series"
        return values[field]

    def fault(self) -> tuple[str, int]:
        """Node and GPU of the first fault, injected or still planned."""
        if self.c.faults:
            f = self.c.faults[0]
            return f.nodes[0], f.gpus[f.nodes[0]][0]
        spec = self.c.next_fault
        assert spec is not None and spec.node is not None and spec.gpu is not None
        return self.c.node_names[spec.node], spec.gpu


def mean_step(c: Cluster, start: float, end: float) -> float:
    return statistics.mean(d for _, t, d in c.step_history if start <= t < end)


# --- the model ---


def test_same_seed_same_cluster_whatever_the_call_pattern() -> None:
    def run(seed: int, chunk: float) -> tuple[list[str], object]:
        c = Cluster(SimConfig(nodes=2, gpus_per_node=4, scenario="ecc_dbe", seed=seed, fault_after=5, start=START))
        lines, t = [], 0.0
        while t < 30:
            t = min(30.0, t + chunk)
            lines += [f"{x.node} {x.stream} {x.text}" for x in c.advance(t)]
        return lines, c.snapshot()

    lines_a, snap_a = run(7, 30.0)
    lines_b, snap_b = run(7, 0.37)
    assert lines_a == lines_b
    assert snap_a == snap_b
    lines_c, snap_c = run(8, 30.0)
    assert lines_c != lines_a
    assert snap_c != snap_a


def test_exporter_text_is_dcgm_exporter_shaped() -> None:
    c = Cluster(SimConfig(nodes=2, gpus_per_node=8, seed=3, start=START))
    c.advance(5)
    text = render(c.snapshot()["node-001"], "node-001")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert 30 <= len(families) <= 50
    assert set(families) == {f.name for f in FIELDS}
    for field in FIELDS:
        assert f"# HELP {field.name} " in text and f"# TYPE {field.name} {field.type}" in text
        samples = families[field.name].samples
        assert sorted(int(s.labels["gpu"]) for s in samples) == list(range(8)), field.name
        for s in samples:
            extra = {"err_code", "err_msg"} if field.name == "DCGM_FI_DEV_XID_ERRORS" else set()
            assert set(s.labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", *extra}
            assert s.labels["Hostname"] == "node-001"
            assert s.labels["device"] == f"nvidia{s.labels['gpu']}"
            assert re.fullmatch(r"GPU-[0-9a-f-]{36}", s.labels["UUID"])
            assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", s.labels["pci_bus_id"])
            assert s.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    # The label layout and the blank sentinel exactly as the exporter prints them.
    assert re.search(
        r'^DCGM_FI_DEV_SM_CLOCK\{gpu="0",UUID="GPU-[^"]+",pci_bus_id="[^"]+",device="nvidia0",'
        r'modelName="NVIDIA H100 80GB HBM3",Hostname="node-001"\} \d+$',
        text,
        re.M,
    )
    assert f"}} {INT64_NOT_SUPPORTED}\n" in text
    assert re.search(r"^DCGM_FI_DEV_POWER_USAGE\{.*\} \d+\.\d{6}$", text, re.M)
    assert 'err_code="0",err_msg="No Error"} 0' in text
    uuids = {s.labels["UUID"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert len(uuids) == 8


def test_exporter_serves_one_path_per_node() -> None:
    c = Cluster(SimConfig(nodes=2, gpus_per_node=2, seed=1, start=START))
    server = MetricsServer()
    server.publish(c.snapshot())
    server.start()
    try:
        with urllib.request.urlopen(server.url("node-001"), timeout=5) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = r.read().decode()
        assert 'Hostname="node-001"' in body and 'Hostname="node-000"' not in body
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url("node-009"), timeout=5)
        assert err.value.code == 404
    finally:
        server.stop()


def test_the_job_breathes_together_and_counters_move() -> None:
    rec = Recorder("healthy", nodes=2, gpus=4)
    series: dict[str, list[float]] = defaultdict(list)

    def sample(t: float, snap: Snapshot) -> None:
        for node in ("node-000", "node-001"):
            tensors = [g.values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] for g in snap[node]]
            series[f"{node} tensor"].append(statistics.mean(tensors))
        g0 = snap["node-000"][0].values
        for name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
            series[name].append(g0[name])
        series["power"].append(g0["DCGM_FI_DEV_POWER_USAGE"])
        series["tensor0"].append(g0["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"])
        series["sm1"].append(snap["node-000"][1].values["DCGM_FI_PROF_SM_ACTIVE"])

    rec.run(20, every=0.1, on_sample=sample)
    for name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert all(b > a for a, b in zip(series[name], series[name][1:], strict=False)), name
    assert max(series["tensor0"]) - min(series["tensor0"]) > 0.2  # compute vs. communication phases
    assert statistics.correlation(series["tensor0"], series["power"]) > 0.6  # activity drives power
    assert statistics.correlation(series["node-000 tensor"], series["node-001 tensor"]) > 0.8  # in step
    snap = rec.c.snapshot()["node-000"]
    assert len({g.values["DCGM_FI_DEV_POWER_USAGE"] for g in snap}) == len(snap)  # each GPU its own noise
    assert all(g.values["DCGM_FI_DEV_XID_ERRORS"] == 0 for g in snap)
    # Step lines on every node, every step, loss slowly going down with noise.
    assert len(rec.step_times()) >= 18
    megatron = [x for t, n, s, x in rec.lines if n == "node-001" and "iteration" in x]
    assert len(megatron) >= 18 and "lm loss: 2." in megatron[0]
    assert rec.text(stream="train").count("step=") == len(rec.step_times())


def test_gpu_lost() -> None:
    rec = Recorder("gpu_lost")
    rec.run(T - 0.5)
    node, gpu = rec.fault()
    assert rec.values(node, gpu) is not None
    rec.run(T + 3)
    assert rec.values(node, gpu) is None, "the lost GPU's series must vanish"
    assert len(rec.c.snapshot()[node]) == 3
    kern = rec.text(node, "kern", after=T)
    assert re.search(
        r"NVRM: Xid \(PCI:0000:[0-9a-f]{2}:00\): 79, pid='<unknown>', name=<unknown>, "
        r"GPU has fallen off the bus\.",
        kern,
    )
    assert re.search(
        r"The NVIDIA GPU 0000:[0-9a-f]{2}:00\.0\n\s+NVRM: \(PCI ID: 10de:2330\) installed in this system has\n"
        r"\s+NVRM: fallen off the bus",
        kern,
    )
    assert all("Xid" not in rec.text(n, "kern") for n in rec.c.node_names if n != node)
    peer = next(n for n in rec.c.node_names if n != node)
    rec.run(T + 2 + W - 1)
    assert "Watchdog caught" not in rec.text(stream="train")
    rec.run(T + 2 + W + 3)
    assert re.search(
        r"\[rank\d+\]:\[E1122 10:00:\d\d\.\d{6} \d+ ProcessGroupNCCL\.cpp:\d+\] \[Rank \d+\] Watchdog caught "
        r"collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=ALLREDUCE, NumelIn=\d+, NumelOut=\d+, "
        r"Timeout\(ms\)=20000\) ran for \d+ milliseconds before timing out\.",
        rec.text(peer, "train"),
    )
    assert max(rec.step_times()) < T + 3, "step progress stops everywhere"


def test_ecc_dbe() -> None:
    rec = Recorder("ecc_dbe")
    rec.run(T - 0.5)
    node, gpu = rec.fault()
    assert rec.value(node, gpu, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    rec.run(T + 2)
    values = rec.values(node, gpu)
    assert values is not None and values["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 1
    assert values["DCGM_FI_DEV_XID_ERRORS"] == 63
    kern = rec.text(node, "kern")
    assert ": 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE)" in kern
    assert kern.index(": 48,") < kern.index(": 63,")
    train = rec.text(node, "train")
    assert "RuntimeError: CUDA error: uncorrectable ECC error encountered" in train
    assert "ChildFailedError" in train
    peers = [n for n in rec.c.node_names if n != node]
    rec.run(T + W + 3)
    assert all("Watchdog caught collective operation timeout" in rec.text(p, "train") for p in peers)
    assert "Watchdog caught" not in rec.text(node, "train")  # its ranks were torn down by torchrun first


def test_nvlink() -> None:
    rec = Recorder("nvlink")
    rec.run(T)
    node, gpu = rec.fault()
    crc0 = rec.value(node, gpu, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    rec.run(T + 20)
    crc1 = rec.value(node, gpu, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    assert crc1 > crc0 + 100
    assert rec.value(node, (gpu + 1) % 4, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") == 0
    assert re.search(r"NVRM: Xid \(PCI:0000:[0-9a-f]{2}:00\): 74, .*NVLink", rec.text(node, "kern"))
    assert mean_step(rec.c, T + 2, T + 20) > 1.15 * mean_step(rec.c, 0, T)


def test_ib_flap() -> None:
    rec = Recorder("ib_flap")
    rec.run(T + W + 50)
    node, _ = rec.fault()
    warn_times = sorted(
        {
            t
            for t, n, s, x in rec.lines
            if n == node and "NCCL WARN NET/IB : Got completion from peer" in x and "with error 12" in x
        }
    )
    assert len(warn_times) == 2 and warn_times[1] - warn_times[0] >= 30, "two flaps, some time apart"
    assert rec.text(node, "kern").count("Link down") == 2 and rec.text(node, "kern").count("Link up") == 2
    peers = [n for n in rec.c.node_names if n != node]
    assert all("Watchdog caught collective operation timeout" in rec.text(p, "train") for p in peers)
    assert all("NCCL WARN" not in rec.text(p) for p in peers)


def test_straggler_is_silent_but_slow() -> None:
    rec = Recorder("straggler")
    rec.run(T - 0.5)
    node, gpu = rec.fault()
    before = rec.values(node, gpu)
    assert before is not None and before["DCGM_FI_DEV_SM_CLOCK"] == 1980
    peer_tensor: dict[str, list[float]] = defaultdict(list)

    def sample(t: float, snap: Snapshot) -> None:
        key = "before" if t <= T else "after"
        peer_tensor[key] += [
            g.values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] for n in snap for g in snap[n] if (n, g.index) != (node, gpu)
        ]

    first_new = len(rec.lines)
    rec.run(T + 40, every=0.1, on_sample=sample)
    after = rec.values(node, gpu)
    assert after is not None and after["DCGM_FI_DEV_SM_CLOCK"] < 1500
    assert after["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] & 0x40  # HW thermal slowdown
    assert after["DCGM_FI_DEV_GPU_TEMP"] > before["DCGM_FI_DEV_GPU_TEMP"] + 15
    peers = [g.values for g in rec.c.snapshot()[node] if g.index != gpu]
    assert all(p["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] & 0x40 == 0 for p in peers)
    assert 1.3 <= mean_step(rec.c, T + 2, T + 40) / mean_step(rec.c, 0, T) <= 1.6
    assert statistics.mean(peer_tensor["after"]) < statistics.mean(peer_tensor["before"] or [0.42]) - 0.03
    new_text = "\n".join(x for _, _, _, x in rec.lines[first_new:])
    assert not any(w in new_text for w in ERROR_WORDS), "a straggler writes no error line"


def test_hang_stops_progress_silently() -> None:
    rec = Recorder("hang")
    rec.run(T + 60)
    node, gpu = rec.fault()
    culprit = rec.c.faults[0].ranks[0]
    assert max(rec.step_times()) < T + 1.5
    assert not any(w in rec.text(after=T) for w in ERROR_WORDS)
    assert rec.c.modes[culprit] == CULPRIT_DATA
    assert all(m == VICTIM for r, m in enumerate(rec.c.modes) if r != culprit)
    control = rec.c.control_text(rec.c.node_names.index(node))
    assert f"{gpu} hang_culprit:data" in control
    # Victims spin in NCCL (utilization 100%, SMs idle); the culprit's GPU is idle.
    assert rec.value(node, (gpu + 1) % 4, "DCGM_FI_DEV_GPU_UTIL") == 100
    assert rec.value(node, (gpu + 1) % 4, "DCGM_FI_PROF_SM_ACTIVE") < 0.1
    assert rec.value(node, gpu, "DCGM_FI_DEV_GPU_UTIL") == 0


def test_user_bug_same_traceback_everywhere() -> None:
    rec = Recorder("user_bug")
    rec.run(T + 3)
    blocks = set()
    for n in rec.c.node_names:
        train = rec.text(n, "train")
        assert "ChildFailedError" in train
        ranks = defaultdict(list)
        for line in train.splitlines():
            m = re.match(r"\[rank(\d+)\]: (.*)", line)
            if m:
                ranks[m.group(1)].append(m.group(2))
        assert len(ranks) == 4
        blocks |= {"\n".join(v) for v in ranks.values()}
    assert len(blocks) == 1, "the same traceback on every rank"
    assert "RuntimeError: The size of tensor a" in blocks.pop()
    assert all(m == CRASH_USER for m in rec.c.modes)
    assert "Xid" not in rec.text(stream="kern", after=T)
    fault = rec.c.ground_truth()["faults"][0]
    assert fault["blame"] == "user_code" and fault["nodes"] == [] and fault["expect_eviction"] is False


def test_nan_loss() -> None:
    rec = Recorder("nan_loss")
    rec.run(T + 15)
    before, after = rec.text(stream="train", before=T), rec.text(stream="train", after=T + 1)
    assert "nan" not in before.replace("number of nan iterations", "")
    assert re.search(r"loss=nan grad_norm=(nan|inf)", after)
    assert re.search(r"lm loss: NAN \| loss scale: 1\.0 \| grad norm: (nan|inf)", after)
    # Megatron counts NaN iterations per logging interval (one step a line here), not since the start: a count
    # that never went back to 0 read as NaN on the logging node long after the job was relaunched.
    assert set(re.findall(r"number of nan iterations:\s+(\d+)", after)) == {"1"}
    assert set(re.findall(r"number of nan iterations:\s+(\d+)", before)) == {"0"}
    assert max(rec.step_times()) > T + 12, "training goes on"
    assert rec.c.ground_truth()["faults"][0]["nodes"] == []


def test_healthy_and_demo() -> None:
    rec = Recorder("healthy")
    rec.run(60)
    assert rec.c.faults == [] and 55 <= len(rec.step_times()) <= 60
    assert not any(w in rec.text(after=0.1) for w in ERROR_WORDS)

    demo = Recorder("demo", fault_every=40.0)
    demo.run(105)
    faults = demo.c.ground_truth()["faults"]
    assert [f["injected_at"] for f in faults] == [(START + timedelta(seconds=s)).isoformat() for s in (10, 50, 90)]
    assert all(f["kind"] in HARDWARE_FAULTS for f in faults)
    assert len({f["kind"] for f in faults}) == 3, "a demo shows different faults"
    assert "repaired_at" in faults[0] and "repaired_at" in faults[1] and "repaired_at" not in faults[2]
    assert demo.c.generation == 2
    repaired = datetime.fromisoformat(faults[1]["repaired_at"]).timestamp() - START.timestamp()
    assert any(repaired < t < 90 for t in demo.step_times()), "steps resume after a repair"


def test_ground_truth() -> None:
    rec = Recorder("gpu_lost", seed=4)
    assert rec.c.ground_truth()["faults"] == []
    rec.run(T + 1)
    gt = rec.c.ground_truth()
    assert gt["scenario"] == "gpu_lost" and gt["job_id"].startswith("sim-gpu_lost-")
    assert gt["nodes"] == ["node-000", "node-001", "node-002"] and gt["world_size"] == 12
    assert gt["started_at"] == START.isoformat()
    (fault,) = gt["faults"]
    node, gpu = rec.fault()
    assert fault == {
        "kind": "gpu_lost",
        "nodes": [node],
        "gpus": {node: [gpu]},
        "ranks": [rec.c.node_names.index(node) * 4 + gpu],
        "injected_at": (START + timedelta(seconds=T)).isoformat(),
        "blame": "infrastructure",
        "expect_eviction": True,
        "eviction_optional": False,
        "expect_action": "evict",
    }


def test_cli_lists_scenarios_and_rejects_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    assert cli.run(parser.parse_args(["sim", "--list-scenarios"])) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in SCENARIOS)
    assert cli.run(parser.parse_args(["sim", "--scenario", "meteor"])) == 2
    assert cli.run(parser.parse_args(["sim", "--scenario", "hang"])) == 2  # agents without --server/--token
    assert "--server" in capsys.readouterr().err


# --- real processes ---

HARNESS = (
    "import argparse, sys; from lab.sim import cli; p = argparse.ArgumentParser(); "
    "cli.add_parser(p.add_subparsers(dest='command')); sys.exit(cli.run(p.parse_args(sys.argv[1:])))"
)
PYSPY = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")


def start_sim(tmp: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HARNESS, "sim", "--dir", str(tmp), "--seed", "3", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=paths.REPO,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_for(predicate: Callable[[], T_], timeout: float, what: str) -> T_:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def rank_pids(node_dir: Path, count: int) -> dict[int, int] | None:
    try:
        lines = (node_dir / "ranks.pids").read_text().splitlines()[1:]
    except FileNotFoundError:
        return None
    pids = {int(a): int(b) for a, b in (line.split() for line in lines)}
    return pids if len(pids) == count else None


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def stack(pid: int) -> list[str]:
    assert PYSPY, "py-spy is installed with the agent"
    out = subprocess.run([PYSPY, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    (thread,) = json.loads(out.stdout)
    return [f["name"].rsplit(".", 1)[-1] for f in thread["frames"]]


def processes_with(job_id: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if (
                    job_id.encode() in (entry / "environ").read_bytes()
                    or job_id.encode() in (entry / "cmdline").read_bytes()
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if alive(p)]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_real_run_ranks_stacks_and_ctrl_c(tmp_path: Path) -> None:
    sim = start_sim(
        tmp_path, "--nodes", "2", "--gpus-per-node", "2", "--scenario", "hang", "--fault-after", "5", "--no-agents"
    )
    try:
        pids = [wait_for(lambda n=n: rank_pids(tmp_path / f"node-00{n}", 2), 20, f"ranks of node {n}") for n in (0, 1)]
        gt = json.loads((tmp_path / "ground_truth.json").read_text())
        job_id = gt["job_id"]
        for node_index, node_pids in enumerate(pids):
            for local, pid in node_pids.items():
                env = environ(pid)
                rank = node_index * 2 + local
                assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(local)
                assert env["GROUP_RANK"] == str(node_index)
                assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
                assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"].isdigit()
                assert env["TORCHELASTIC_RUN_ID"] == job_id and env["FAULTLINE_JOB_ID"] == job_id
            launcher = int(
                Path(f"/proc/{next(iter(node_pids.values()))}/stat").read_text().rsplit(")", 1)[1].split()[1]
            )
            assert "lab.sim.launcher" in Path(f"/proc/{launcher}/cmdline").read_text()
            children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
            assert sorted(map(int, children)) == sorted(node_pids.values()), "ranks run under the launcher"
            assert "RANK" not in environ(launcher)
        # Normal: a training loop.
        wait_for(lambda: {"train_step", "train", "main"} <= set(stack(pids[0][0])), 10, "a training-loop stack")
        # Hang: one culprit in the data loader, the others wait in all_reduce.
        wait_for(lambda: json.loads((tmp_path / "ground_truth.json").read_text())["faults"], 15, "the injection")
        culprit = json.loads((tmp_path / "ground_truth.json").read_text())["faults"][0]["ranks"][0]
        by_rank = {n * 2 + lr: pid for n, node_pids in enumerate(pids) for lr, pid in node_pids.items()}
        stuck_in = {rank: {"all_reduce", "_wait_for_work"} for rank in by_rank}
        stuck_in[culprit] = {"_next_data", "_get_data"}
        for rank, frames in stuck_in.items():
            wait_for(lambda r=rank, f=frames: f <= set(stack(by_rank[r])), 10, f"rank {rank} stuck in {frames}")
        for _ in range(3):  # stuck, not passing through: every dump shows the same place
            time.sleep(0.3)
            assert all(frames <= set(stack(by_rank[r])) for r, frames in stuck_in.items())
        # Sleep-based: a rank has used almost no CPU.
        ticks = sum(int(x) for x in Path(f"/proc/{by_rank[0]}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
        assert ticks / os.sysconf("SC_CLK_TCK") < 0.5
        every = processes_with(job_id)
        assert len(every) >= 6  # 2 launchers + 4 ranks
    finally:
        sim.send_signal(signal.SIGINT)
        out, _ = sim.communicate(timeout=20)
    assert sim.returncode == 0, out
    assert "injected hang on node-" in out and "stopped after" in out
    assert re.search(r"node-001 up: http://127\.0\.0\.1:\d+/node-001/metrics, launcher pid \d+", out)
    wait_for(lambda: not processes_with(job_id), 5, "no process left behind")
    assert "step=" in (tmp_path / "node-000" / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_real_run_agents_crash_and_sigkill(tmp_path: Path) -> None:
    fake_agent = (
        f"{sys.executable} -c 'import os, sys, time; "
        'print(os.environ.get("FAULTLINE_AGENT_TOKEN"), *sys.argv[1:], flush=True); time.sleep(600)\''
    )
    sim = start_sim(
        tmp_path, "--nodes", "1", "--gpus-per-node", "2", "--scenario", "user_bug", "--fault-after", "3",
        "--server", "http://127.0.0.1:9", "--token", "t0k", "--agent-command", fake_agent, "--job-id", "sim-e2e-kill",
    )  # fmt: skip
    node_dir = tmp_path / "node-000"
    try:
        pids = wait_for(lambda: rank_pids(node_dir, 2), 20, "ranks")
        launcher = int(Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        argv = wait_for(lambda: (node_dir / "agent.log").read_text().strip(), 10, "the agent's command line")
        assert re.fullmatch(
            # The token travels in the environment, not on the command line (which `ps` shows to everyone).
            rf"t0k --server http://127\.0\.0\.1:9 --node-name node-000 --interval 1\.0 "
            rf"--dcgm-url http://127\.0\.0\.1:\d+/node-000/metrics --kmsg {node_dir.resolve()}/kern\.log "
            rf"--log {node_dir.resolve()}/train\.log --watch-pid {launcher} --spool-dir {node_dir.resolve()}/spool"
            # The agent's host and network collectors read the node's fake kernel tree.
            rf" --sysfs-root {node_dir.resolve()}/sys --procfs-root {node_dir.resolve()}/proc"
            # Where the machine sits, as its operator labels it (lab/sim/shared_faults.py).
            r" --node-label=rack=node-rack-0 --node-label=switch=node-leaf-0 --node-label=power_domain=node-pdu-0"
            r" --storage-mount=/mnt/datasets/node",
            argv,
        )
        port = argv.split("/node-000/metrics")[0].rsplit(":", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/node-000/metrics", timeout=5) as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        assert len(families["DCGM_FI_DEV_GPU_UTIL"].samples) == 2
        # The bug: every rank raises and exits; the launcher stays, like an elastic agent awaiting restart.
        wait_for(lambda: not any(alive(p) for p in pids.values()), 15, "the ranks to crash")
        # Both ranks write their tracebacks into the one log at once, so a line can come out split by the other's
        # (the whole message was asserted, and a CI run saw it cut): its parts, and each rank's exit.
        expected = ("exited with code 1", "RuntimeError", "The size of tensor a (8192)", "must match")
        wait_for(lambda: all(s in (node_dir / "launcher.log").read_text() for s in expected), 10, "the crash's log")
        assert alive(launcher)
        (agent,) = [p for p in processes_with(f"--watch-pid\0{launcher}\0") if p != sim.pid]
        assert "time.sleep(600)" in Path(f"/proc/{agent}/cmdline").read_text()
    finally:
        sim.kill()  # SIGKILL: no chance to clean up; PR_SET_PDEATHSIG must take everything down
        sim.wait(timeout=10)
    wait_for(lambda: not alive(launcher) and not alive(agent), 5, "launcher and agent to die with the simulator")
    assert not processes_with("sim-e2e-kill")


# --- realism: the runner's side (late and restarting agents, clock skew) ---


def test_runner_starts_a_late_agent_and_restarts_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.sim.realism import START as START_AGENT
    from lab.sim.realism import STOP, AgentAction
    from lab.sim.runner import SimRunner

    runner = SimRunner(SimConfig(dir=tmp_path, server="http://127.0.0.1:1", token="t"))
    started: list[int] = []

    def fake_start(n: int, name: str) -> None:
        started.append(n)
        runner.agents[n] = subprocess.Popen(["sleep", "30"], start_new_session=True)

    monkeypatch.setattr(runner, "_start_agent", fake_start)
    runner._act_on_agent(AgentAction(30.0, 2, START_AGENT))
    assert started == [2] and runner.agents[2].poll() is None
    runner._act_on_agent(AgentAction(31.0, 2, START_AGENT))  # already running: nothing more
    assert started == [2]
    proc = runner.agents[2]
    runner._act_on_agent(AgentAction(40.0, 2, STOP, "KILL"))
    assert proc.returncode == -signal.SIGKILL and 2 not in runner.agents
    runner._act_on_agent(AgentAction(45.0, 2, START_AGENT))
    assert started == [2, 2]
    proc = runner.agents[2]
    runner._act_on_agent(AgentAction(50.0, 2, STOP, "TERM"))
    assert proc.returncode == -signal.SIGTERM


def test_runner_gives_a_skewed_nodes_agent_its_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from lab.sim import runner as runner_module
    from lab.sim.config import RealismParams

    config = SimConfig(
        nodes=2, gpus_per_node=2, seed=3, dir=tmp_path, server="http://127.0.0.1:1", token="t", realism=True,
        realism_params=RealismParams(clock_skew_sd_s=3.0),
    )  # fmt: skip
    (tmp_path / "node-000").mkdir()
    runner = runner_module.SimRunner(config)
    runner.cluster = Cluster(config)
    runner.server = SimpleNamespace(url=lambda name: f"http://127.0.0.1:1/{name}/metrics")  # type: ignore[assignment]
    runner.launchers = {0: SimpleNamespace(pid=1), 1: SimpleNamespace(pid=1)}  # type: ignore[dict-item]
    envs: list[dict[str, str]] = []
    monkeypatch.setattr(runner_module, "spawn", lambda command, env, stdout: envs.append(env) or SimpleNamespace(pid=9))
    runner._start_agent(0, "node-000")
    skew = runner.cluster.skew[0].total_seconds()
    assert skew and envs[0]["FAULTLINE_SIM_CLOCK_SKEW_S"] == str(skew)
    assert envs[0]["PYTHONPATH"].split(os.pathsep)[0] == str(runner_module.SKEW_CLOCK_DIR)
    plain = runner_module.SimRunner(replace(config, realism=False))
    plain.cluster, plain.server, plain.launchers = (
        Cluster(replace(config, realism=False)),
        runner.server,
        runner.launchers,
    )
    plain._start_agent(0, "node-000")
    assert "FAULTLINE_SIM_CLOCK_SKEW_S" not in envs[1]


def test_skewed_clock_in_a_python_process() -> None:
    from lab.sim.runner import SKEW_CLOCK_DIR

    code = (
        "import time, datetime as d\n"
        "from datetime import UTC, datetime\n"
        "print(time.time(), datetime.now(UTC).timestamp(), d.datetime.now().timestamp(), time.monotonic(),"
        " isinstance(datetime.now(UTC), d.datetime))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SKEW_CLOCK_DIR), "FAULTLINE_SIM_CLOCK_SKEW_S": "-4.25"}
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=20, check=True)
    after = time.time()
    wall, aware, naive, _, isinstance_ok = out.stdout.split()
    for value in (wall, aware, naive):
        assert before - 4.25 - 0.01 <= float(value) <= after - 4.25 + 0.01
    assert isinstance_ok == "True"
