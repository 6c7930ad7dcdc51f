"""The simulator's real-life healthy noise and harder faults (issue 17), on the pure model: each behaviour shows in
the signals the service sees (DCGM values, training and kernel lines, the fake kernel tree), each new fault changes
what it should and only on the faulty node, the ground truth carries the new fields, and with realism off the
model's output is exactly what it was before realism existed."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import statistics
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from lab.sim.config import RealismParams, SimConfig
from lab.sim.kerneltree import NodeTree
from lab.sim.model import Cluster, LogLine
from lab.sim.modes import CHECKPOINT, CULPRIT_CKPT, CULPRIT_DATA, NORMAL, TERMINATED, VICTIM_BARRIER
from lab.sim.realism import START, STOP
from lab.sim.scenarios import FAULT_KINDS, FLAP_OFF_S, FLAP_ON_S, SCENARIOS, SHARED_FAULT_KINDS, TWO_FAULTS_GAP_S

START_AT = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)
T = 10.0  # fault_after
# Every kind of noise off: a test switches on the one it looks at.
QUIET = RealismParams(
    checkpoint_every_s=0,
    eval_every_s=0,
    restart_every_s=0,
    loader_stall_every_s=0,
    loss_spike_every_s=0,
    agent_restart_every_s=0,
    late_join_nodes=0,
    clock_skew_sd_s=0,
    node_speed_sd=0,
    thermal_drift_c=0,
)
SM = "DCGM_FI_PROF_SM_ACTIVE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
PCIE_TX = "DCGM_FI_PROF_PCIE_TX_BYTES"
STEP = re.compile(r"rank=(\d+) step=(\d+) ")
ITERATION = re.compile(r"iteration\s+(\d+)/")


def cluster(
    scenario: str = "healthy", *, realism: bool = True, seed: int = 5, nodes: int = 3, **params: Any
) -> Cluster:
    config = SimConfig(
        nodes=nodes,
        gpus_per_node=4,
        scenario=scenario,
        seed=seed,
        fault_after=T,
        start=START_AT,
        realism=realism,
        realism_params=replace(QUIET, **params),
    )
    return Cluster(config)


class Run:
    """Advances a cluster tick by tick, keeping every line and, per tick, every GPU's values."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.lines: list[tuple[float, LogLine]] = []
        self.samples: list[tuple[float, dict[str, list[dict[str, float]]]]] = []
        self.actions: list[Any] = []

    def run(self, until: float, every: float = 0.1, sample: bool = True) -> Run:
        t = self.c.t
        while t < until - 1e-9:
            t = round(t + every, 6)
            self.lines += [(t, line) for line in self.c.advance(t)]
            self.actions += self.c.take_agent_actions()
            if sample:
                snap = {n: [g.values for g in gpus] for n, gpus in self.c.snapshot().items()}
                self.samples.append((t, snap))
        return self

    def train(self, node: str | None = None) -> list[tuple[float, str]]:
        return [(t, x.text) for t, x in self.lines if x.stream == "train" and node in (None, x.node)]

    def kern(self, node: str | None = None) -> list[tuple[float, str]]:
        return [(t, x.text) for t, x in self.lines if x.stream == "kern" and node in (None, x.node)]

    def first(self, text: str) -> float:
        return next(t for t, x in self.lines if text in x.text)

    def step_lines(self, after: float = -1.0, before: float = math.inf) -> list[tuple[float, int]]:
        """(time, step) of node-000's step lines."""
        out = []
        for t, x in self.train("node-000"):
            if after <= t < before and (m := STEP.search(x)):
                out.append((t, int(m[2])))
        return out

    def mean(self, field: str, node: str, after: float, before: float, gpu: int | None = None) -> float:
        vals = [
            v[field]
            for t, snap in self.samples
            if after <= t < before
            for i, v in enumerate(snap[node])
            if gpu is None or i == gpu
        ]
        return statistics.mean(vals)


# --- realism off: the model as it was ---

# Digests of the model's output before realism existed (same seeds, same runs): lines, every GPU's values each
# second, the kernel trees every 10 s, node 0's control file. Issue 26 seeded the fault plan by the scenario as
# well as the seed (the fault's node and GPU moved) and added the machine's node rank to the control file; the
# model's output was otherwise checked unchanged by the machine-indexed rewrite (spares, the closed loop).
BEFORE_REALISM = {
    "healthy": "bdde409b759d6c69",
    "demo": "13d3af1734c64d8f",
    "ib_port_flap_nccl": "376f0218af79d624",
    "host_mem_pressure": "73b819115d4e47bc",
    "hang": "9796609c1d377803",
}


def _digest(scenario: str, **kw: Any) -> str:
    c = Cluster(SimConfig(nodes=3, gpus_per_node=4, scenario=scenario, seed=5, fault_after=10, start=START_AT, **kw))
    trees = [NodeTree(n, c.hosts[i], c.fabrics[i]) for i, n in enumerate(c.node_names)]
    h = hashlib.sha256()
    t = 0.0
    while t < 90.0:
        t += 1.0
        for line in c.advance(t):
            h.update(f"{line.node}|{line.stream}|{line.text}\n".encode())
        for node, gpus in c.snapshot().items():
            for g in gpus:
                h.update(json.dumps([node, g.index, g.values], sort_keys=True).encode())
        if int(t) % 10 == 0:
            for tree in trees:
                h.update(json.dumps(tree.files(), sort_keys=True).encode())
        h.update(c.control_text(0).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("scenario", sorted(BEFORE_REALISM))
def test_realism_off_leaves_the_model_unchanged(scenario: str) -> None:
    assert SimConfig().realism is False
    kw = {"fault_every": 30.0} if scenario == "demo" else {}
    assert _digest(scenario, **kw) == BEFORE_REALISM[scenario]


def test_realism_is_deterministic_whatever_the_call_pattern() -> None:
    def run(every: float, seed: int = 7) -> tuple[list[str], list[Any], dict[str, Any]]:
        config = SimConfig(nodes=3, gpus_per_node=4, scenario="healthy_real", seed=seed, start=START_AT, job_id="j")
        c = Cluster(config)
        r = Run(c).run(300, every=every, sample=False)
        truth = c.ground_truth()
        truth.pop("t")  # when it was written: the last call's time, which the call pattern sets
        return [f"{x.node} {x.text}" for _, x in r.lines], r.actions, truth

    a, b = run(300.0), run(0.7)
    assert a[0] == b[0] and a[2] == b[2]
    assert [(x.node, x.action, x.signal) for x in a[1]] == [(x.node, x.action, x.signal) for x in b[1]]
    assert run(300.0, seed=8)[0] != a[0]


# --- the job's pauses ---


def test_checkpoint_pauses_every_rank_and_writes_to_storage() -> None:
    c = cluster(checkpoint_every_s=60.0, checkpoint_s=(25.0, 30.0))
    trees = {n: NodeTree(n, c.hosts[i], c.fabrics[i]) for i, n in enumerate(c.node_names)}
    nic = c.fabrics[0].nic.statistics
    tx: list[tuple[float, int]] = []
    iowait: list[tuple[float, float]] = []
    r = Run(c)
    while c.t < 150:
        r.run(c.t + 1.0)
        tx.append((c.t, nic["tx_bytes"]))
        iowait.append((c.t, sum(j[4] for j in c.hosts[0].jiffies)))
    saving, saved = r.first("saving checkpoint at iteration"), r.first("successfully saved checkpoint from iteration")
    assert 18 <= saving <= 61 and 25 <= saved - saving <= 31
    # Megatron's own lines, from rank 0; the iteration saved is the last one trained.
    text = "\n".join(x for _, x in r.train("node-000"))
    it = int(re.search(r"saving checkpoint at iteration\s+(\d+) to /checkpoints/llm in torch_dist format", text)[1])
    assert re.search(
        rf"  successfully saved checkpoint from iteration\s+{it} to /checkpoints/llm \[ t 1/1, p 1/1 \]", text
    )
    assert "save-checkpoint" in text
    before = r.step_lines(before=saving + 0.01)
    assert before[-1][1] == it
    # No step lines during the save; then steps resume where they stopped.
    assert r.step_lines(after=saving + 0.01, before=saved) == []
    after = r.step_lines(after=saved)
    assert after[0][1] == it + 1 and after[0][0] - saved < 2.0
    # GPUs: computing before, nearly idle (copying to the host over PCIe) during the save.
    for node in c.node_names:
        assert r.mean(SM, node, saving - 15, saving - 1) > 0.4
        assert r.mean(SM, node, saving + 3, saved - 1) < 0.06
        assert r.mean(PCIE_TX, node, saving + 3, saved - 1) > 5e9

    # Storage NIC bytes out rise several fold; iowait a little.
    def rate(series: list[tuple[float, float]], a: float, b: float) -> float:
        (t0, v0), (t1, v1) = min(series, key=lambda x: abs(x[0] - a)), min(series, key=lambda x: abs(x[0] - b))
        return (v1 - v0) / (t1 - t0)

    assert rate(tx, saving + 2, saved - 2) > 20 * rate(tx, saving - 16, saving - 2)
    assert rate(iowait, saving + 2, saved - 2) > 2 * rate(iowait, saving - 16, saving - 2)
    assert "checkpoint" in [e["kind"] for e in c.ground_truth()["realism"]["events"]]
    assert trees["node-000"].files()["proc/stat"]  # the tree still renders


def test_ranks_are_told_to_save_and_come_back() -> None:
    c = cluster(checkpoint_every_s=40.0)
    r = Run(c)
    r.run(r.c.t + 1)
    while not c.job.pause:
        r.run(c.t + 0.5, sample=False)
    assert set(c.modes) == {CHECKPOINT} and "0 checkpoint" in c.control_text(0)
    while c.job.pause:
        r.run(c.t + 0.5, sample=False)
    assert set(c.modes) == {NORMAL}


def test_evaluation_has_its_own_rhythm_and_a_validation_line() -> None:
    c = cluster(eval_every_s=50.0, eval_iters=20, eval_step_share=0.4)
    r = Run(c)
    activity: list[tuple[float, str]] = []
    while c.t < 120:
        r.run(c.t + 0.1, sample=False)
        activity.append((c.t, c._activity(0)))
    start = next(e["t"] for e in c.ground_truth()["realism"]["events"] if e["kind"] == "evaluation")
    end = r.first("validation loss at iteration")
    assert 7.5 <= end - start <= 8.5  # 20 forward-only steps of 0.4 s
    assert r.step_lines(after=start + 0.01, before=end) == []
    # Compute bursts every 0.4 s instead of every second.
    during = [a for t, a in activity if start + 0.5 <= t < end - 0.5]
    bursts = sum(1 for x, y in itertools.pairwise(during) if x != "compute" and y == "compute")
    assert 15 <= bursts <= 20
    block = next(x for t, x in r.train("node-002") if "validation loss" in x).split("\n")
    assert len(block) == 3 and set(block[0]) == {"-"} and len(block[0]) == len(block[1]) + 1
    assert re.fullmatch(
        r" validation loss at iteration \d+ \| lm loss value: \d\.\d{6}E\+00 \| lm loss PPL: .* \| ", block[1]
    )
    assert r.step_lines(after=end)  # training goes on


def test_restart_exits_every_process_and_repeats_steps_from_the_checkpoint() -> None:
    c = cluster(
        checkpoint_every_s=100.0,
        checkpoint_s=(10.0, 10.0),
        restart_every_s=1000.0,
        first_restart_s=110.0,
        restart_down_s=(30.0, 30.0),
    )
    r = Run(c).run(250)
    events = c.ground_truth()["realism"]["events"]
    restart = next(e for e in events if e["kind"] == "restart")
    t0 = restart["t"]
    ckpt = [e["iteration"] for e in events if e["kind"] == "checkpoint" and e["t"] < t0]
    assert restart["from_iteration"] == (ckpt[-1] if ckpt else 0)
    # torchrun passes SIGTERM on; every rank's process is gone, its GPU empty.
    assert any("Received Signals.SIGTERM death signal" in x for t, x in r.train("node-001") if abs(t - t0) < 0.2)
    mid = [snap for t, snap in r.samples if t0 + 5 < t < t0 + 25]
    assert all(v["DCGM_FI_DEV_FB_USED"] == 0 and v[UTIL] == 0 for snap in mid for vs in snap.values() for v in vs)
    # Then a new generation loads the checkpoint and trains the same iterations again.
    assert c.generation >= 1
    loaded = (
        "successfully loaded checkpoint from /checkpoints/llm [ t 1/1, p 1/1 ] "
        f"at iteration {restart['from_iteration']}"
    )
    assert any(loaded in x for _, x in r.train("node-000"))
    last_before = r.step_lines(before=t0)[-1][1]
    again = r.step_lines(after=t0)
    assert again[0][1] == restart["from_iteration"] + 1 < last_before - 10
    assert again[0][0] >= t0 + 30.0 + c.config.realism_params.restart_load_s


def test_restart_tells_the_rank_processes() -> None:
    c = cluster(restart_every_s=1.0, restart_down_s=(10.0, 10.0))
    r = Run(c)
    while not c.job.pause:
        r.run(c.t + 0.5, sample=False)
    assert set(c.modes) == {TERMINATED} and c.control_text(1).startswith("generation 0\n")
    r.run(c.t + 11, sample=False)
    assert set(c.modes) == {NORMAL} and c.control_text(1).startswith("generation 1\n")


def test_loader_stall_on_one_rank_recovers() -> None:
    c = cluster(loader_stall_every_s=30.0, loader_stall_s=(4.0, 4.0))
    r = Run(c)
    modes: list[tuple[float, list[str]]] = []
    while c.t < 90:
        r.run(c.t + 0.5)
        modes.append((c.t, list(c.modes)))
    stall = next(e for e in c.ground_truth()["realism"]["events"] if e["kind"] == "loader_stall")
    t0, rank = stall["t"], stall["rank"]
    node, gpu = c.node_names[rank // 4], rank % 4
    during = [m for t, m in modes if t0 + 0.4 < t < t0 + 3.6]
    assert during and all(m[rank] == CULPRIT_DATA and m.count(NORMAL) == 11 for m in during)
    # Its GPU idles; the others spin in the all-reduce (utilization 100%, SMs idle).
    assert r.mean(UTIL, node, t0 + 1.5, t0 + 3.6, gpu=gpu) < 5
    other = c.node_names[(rank // 4 + 1) % 3]
    assert r.mean(UTIL, other, t0 + 1.5, t0 + 3.6) > 95 and r.mean(SM, other, t0 + 1.5, t0 + 3.6) < 0.1
    assert r.step_lines(after=t0 + 0.6, before=t0 + 4.0) == []
    assert all(m[rank] == NORMAL for t, m in modes if t0 + 4.5 < t < t0 + 20)
    assert r.step_lines(after=t0 + 4.0, before=t0 + 8.0)


def test_learning_rate_warms_up_and_loss_spikes_recover() -> None:
    c = cluster(warmup_iters=100, loss_spike_every_s=100.0, loss_spike_factor=(2.0, 2.0), loss_spike_steps=8.0)
    r = Run(c).run(200, sample=False)
    megatron = [x for _, x in r.train("node-002") if "lm loss:" in x]
    it = [int(ITERATION.search(x)[1]) for x in megatron]
    lr = [float(re.search(r"learning rate: (\S+) \|", x)[1]) for x in megatron]
    loss = [float(re.search(r"lm loss: (\S+) \|", x)[1]) for x in megatron]
    assert it[0] == 1  # a fresh job
    assert lr[0] == pytest.approx(3e-4 * 2 / 100) and lr[49] == pytest.approx(3e-4 * 51 / 100)
    assert all(b > a for a, b in itertools.pairwise(lr[:99]))
    assert lr[150] == pytest.approx(3e-4, rel=1e-3)  # then the cosine schedule, from its peak
    spikes = [e["iteration"] for e in c.ground_truth()["realism"]["events"] if e["kind"] == "loss_spike"]
    # The first spike with no other one in the 40 iterations after it.
    first = next(s for s in spikes if not [x for x in spikes if s < x <= s + 40] and s + 40 < it[-1] and s > 10)
    i = it.index(first)
    trend = statistics.mean(loss[i - 6 : i - 1])
    assert loss[i] > 1.8 * trend
    assert loss[i + 40] < 1.1 * trend  # recovered


def test_nodes_differ_a_few_percent_and_temperatures_drift_over_the_day() -> None:
    c = cluster(node_speed_sd=0.02, node_speed_max=0.04, thermal_drift_c=3.0, day_s=600.0, nodes=4)
    speeds = c.real.speed  # type: ignore[union-attr]
    assert all(0.96 <= s <= 1.04 for s in speeds) and len(set(speeds)) == 4
    temps: list[float] = []
    compute: list[list[float]] = [[] for _ in range(4)]
    r = Run(c)
    for _ in range(60):
        r.run(c.t + 10.0, sample=False)
        temps.append(c.gpus[1][2].temp)
        for n in range(4):
            compute[n] += c.job.compute[n * 4 : n * 4 + 4]
    # Compute time per step follows each node's speed (the rest is each step's own noise).
    mean = [statistics.mean(x) for x in compute]
    for n in range(4):
        assert mean[n] * speeds[n] == pytest.approx(mean[0] * speeds[0], rel=0.01)
    assert max(temps) - min(temps) > 4.0  # ~6 C peak to peak; a GPU's own noise is a fraction of a degree
    assert statistics.pstdev(c.job.compute) / statistics.mean(c.job.compute) < 0.05


def test_a_late_node_and_restarting_agents() -> None:
    c = cluster(
        late_join_nodes=1, late_join_s=(30.0, 40.0), agent_restart_every_s=300.0, agent_down_s=(3.0, 6.0), nodes=2
    )
    late = [n for n in range(2) if c.agent_delay(n) > 0]
    assert len(late) == 1 and 30 <= c.agent_delay(late[0]) <= 40
    r = Run(c).run(1200, every=1.0, sample=False)
    starts = [a for a in r.actions if a.action == START]
    stops = [a for a in r.actions if a.action == STOP]
    first = next(a for a in starts if a.node == late[0])
    assert 30 <= first.t <= 41 and not [a for a in r.actions if a.node == late[0] and a.t < first.t]
    assert 3 <= len(stops) <= 20  # ~8 expected: every 300 s on average per node
    assert {a.signal for a in stops} <= {"TERM", "KILL"}
    for stop in stops:  # each stopped agent comes back a few seconds later
        back = next(a for a in starts if a.node == stop.node and a.t > stop.t)
        assert 3.0 <= back.t - stop.t <= 7.0
    assert c.ground_truth()["realism"]["late_agents"] == {c.node_names[late[0]]: round(c.agent_delay(late[0]), 1)}


def test_clock_skew_offsets_each_nodes_timestamps() -> None:
    c = cluster(clock_skew_sd_s=3.0, clock_skew_max_s=5.0)
    skew = [s.total_seconds() for s in c.skew]
    assert all(abs(s) <= 5.0 for s in skew) and len(set(skew)) == 3
    r = Run(c).run(30, sample=False)
    stamps: dict[str, dict[int, datetime]] = {}
    for node in c.node_names[:2]:
        for _, x in r.train(node):
            if m := STEP.search(x):
                stamps.setdefault(node, {})[int(m[2])] = datetime.strptime(x[:23], "%Y-%m-%d %H:%M:%S,%f")
    step = 20
    diff = (stamps["node-001"][step] - stamps["node-000"][step]).total_seconds()
    assert diff == pytest.approx(skew[1] - skew[0], abs=0.002)
    assert c.ground_truth()["realism"]["clock_skew_s"] == dict(zip(c.node_names, skew, strict=True))

    # The kernel log too: node 1's boot banner, against the same model's without skew (dmesg -T: whole seconds).
    def dmesg_time(text: str) -> datetime:
        return datetime.strptime(text[1:25], "%a %b %d %H:%M:%S %Y")

    plain = cluster(realism=False)
    banner = next(x for _, x in Run(plain).run(0.1, sample=False).kern("node-001"))
    skewed = next(x for _, x in r.kern("node-001"))
    shift = (dmesg_time(skewed) - dmesg_time(banner)).total_seconds()
    assert math.floor(skew[1]) <= shift <= math.ceil(skew[1]) and skewed[26:] == banner[26:]


# --- harder faults ---


def test_two_faults_in_one_job() -> None:
    c = cluster("two_faults", realism=False, seed=3)
    r = Run(c).run(T + TWO_FAULTS_GAP_S + 40, every=0.5)
    slow, lost = c.ground_truth()["faults"]
    assert (slow["kind"], lost["kind"]) == ("straggler", "gpu_lost") and slow["nodes"] != lost["nodes"]
    assert (
        slow["expect_action"] == lost["expect_action"] == "evict"
        and slow["expect_eviction"]
        and lost["expect_eviction"]
    )
    assert (
        datetime.fromisoformat(lost["injected_at"]) - datetime.fromisoformat(slow["injected_at"])
    ).total_seconds() == TWO_FAULTS_GAP_S
    (s_node,), (l_node,) = slow["nodes"], lost["nodes"]
    s_gpu = slow["gpus"][s_node][0]
    # The straggler throttles on its node only; the Xid 79 is on the other node's kernel log only.
    for node in c.node_names:
        for g in range(4):
            hot = r.mean("DCGM_FI_DEV_GPU_TEMP", node, T + 60, T + 150, gpu=g)
            assert (hot > 80) == (node == s_node and g == s_gpu)
        xid79 = any("Xid" in x and ": 79," in x for _, x in r.kern(node))
        assert xid79 == (node == l_node)
    assert c.job.state in ("hung", "failed")


def test_fault_in_checkpoint_comes_during_the_save() -> None:
    c = cluster("fault_in_checkpoint", realism=False, seed=4)
    assert c.config.realism and c.real is not None  # the scenario switches realism on
    r = Run(c).run(T + 40, every=0.2)
    (fault,) = c.ground_truth()["faults"]
    assert (
        fault["kind"] == "fault_in_checkpoint"
        and fault["expect_action"] == "evict"
        and fault["blame"] == "infrastructure"
    )
    saving, xid = r.first("saving checkpoint at iteration"), r.first("GPU has fallen off the bus")
    assert saving <= T + 0.2 and 3.0 <= xid - saving <= 8.5
    injected = (datetime.fromisoformat(fault["injected_at"]) - c.start).total_seconds()
    assert abs(injected - xid) <= 0.2  # the fault's time is the Xid's, not the save's start
    assert not any("successfully saved checkpoint" in x for _, x in r.train())
    (node,) = fault["nodes"]
    assert [n for n in c.node_names if any(": 79," in x for _, x in r.kern(n))] == [node]
    # The others finished saving and wait in the barrier; the watchdog takes the job down.
    assert any("Watchdog caught collective operation timeout" in x for _, x in r.train())
    assert c.job.state == "failed"


def test_hang_in_checkpoint_stuck_in_the_save() -> None:
    c = cluster("hang_in_checkpoint", realism=False, seed=6)
    r = Run(c)
    r.run(T + 0.5)
    (fault,) = c.ground_truth()["faults"]
    culprit = fault["ranks"][0]
    assert c.modes[culprit] == CULPRIT_CKPT and c.modes.count(CHECKPOINT) == 11
    assert f"{culprit % 4} hang_culprit:ckpt" in c.control_text(culprit // 4)
    r.run(T + 60)
    assert c.job.state == "hung"
    assert all(m == VICTIM_BARRIER for i, m in enumerate(c.modes) if i != culprit) and c.modes[culprit] == CULPRIT_CKPT
    assert not any("successfully saved" in x for _, x in r.train())
    node, gpu = c.node_names[culprit // 4], culprit % 4
    assert r.mean(UTIL, node, T + 45, T + 60, gpu=gpu) == 0  # stuck on storage, the GPU idle
    for other in c.node_names:
        if other != node:
            assert r.mean(UTIL, other, T + 45, T + 60) > 95  # spinning in the barrier
    assert fault["expect_eviction"] and fault["expect_action"] == "evict" and fault["nodes"] == [node]
    assert not any("Watchdog" in x for _, x in r.train())  # silent until the long watchdog


def test_intermittent_straggler_flaps() -> None:
    c = cluster("intermittent_straggler", realism=False, seed=2)
    r = Run(c).run(T + 2 * (FLAP_ON_S + FLAP_OFF_S) + 5, every=0.5)
    (fault,) = c.ground_truth()["faults"]
    (node,) = fault["nodes"]
    gpu = fault["gpus"][node][0]

    def throttled(a: float, b: float, n: str = node, g: int = gpu) -> float:
        return r.mean("DCGM_FI_DEV_SM_CLOCK", n, a, b, gpu=g)

    on1, off1, on2 = (
        (T + 5, T + FLAP_ON_S),
        (T + FLAP_ON_S + 5, T + FLAP_ON_S + FLAP_OFF_S),
        (
            T + FLAP_ON_S + FLAP_OFF_S + 5,
            T + 2 * FLAP_ON_S + FLAP_OFF_S,
        ),
    )
    assert throttled(*on1) < 1500 and throttled(*off1) > 1800 and throttled(*on2) < 1500
    steps = {
        k: statistics.mean(d for _, t, d in c.step_history if a <= t < b)
        for k, (a, b) in {"on": on1, "off": off1}.items()
    }
    assert steps["on"] > 1.3 * steps["off"]
    for other in c.node_names:
        for g in range(4):
            if (other, g) != (node, gpu):
                assert throttled(*on1, n=other, g=g) > 1800
    assert fault["expect_eviction"] and fault["expect_action"] == "evict"


def test_software_slow_burns_the_nodes_cpus_and_starves_its_gpus() -> None:
    c = cluster("software_slow", realism=False, seed=8)
    r = Run(c).run(T + 70, every=0.5)
    (fault,) = c.ground_truth()["faults"]
    assert fault["expect_eviction"] is False and fault["eviction_optional"] is False
    assert fault["expect_action"] == "diagnose" and fault["blame"] == "user_code" and fault["gpus"] == {}
    (node,) = fault["nodes"]
    n = c.node_names.index(node)
    assert len(c.hosts[n].hog) > 0 and all(not h.hog for i, h in enumerate(c.hosts) if i != n)
    assert c.hosts[n].load[0] > max(h.load[0] for i, h in enumerate(c.hosts) if i != n) + 10
    before = statistics.mean(d for _, t, d in c.step_history if t < T)
    after = statistics.mean(d for _, t, d in c.step_history if t > T + 5)
    assert 1.2 < after / before < 1.45
    # The node's GPUs wait on data (idle part of each step); its peers wait on it in the all-reduce (busy).
    util = {name: r.mean(UTIL, name, T + 5, T + 70) for name in c.node_names}
    assert util[node] < 90 and all(util[x] > 97 for x in c.node_names if x != node)
    assert not [x for _, x in r.kern() if "Xid" in x] and not [x for _, x in r.train() if "WARN" in x or "Error" in x]


@pytest.mark.parametrize(("seed", "variant"), [(5, "pcie_replay"), (1, "loader_stall"), (2, "nccl_retry")])
def test_transient_on_one_healthy_node_is_noise(seed: int, variant: str) -> None:
    c = cluster("transient", realism=False, seed=seed)
    plain = cluster("healthy", realism=False, seed=seed)
    r, p = Run(c).run(T + 30, every=0.5), Run(plain).run(T + 30, every=0.5)
    gt = c.ground_truth()
    assert gt["faults"] == []  # nothing to find
    (noise,) = gt["noise"]
    assert noise["kind"] == "transient" and noise["variant"] == variant and noise["expect_action"] == "none"
    assert noise["expect_eviction"] is False and noise["eviction_optional"] is False
    (node,) = noise["nodes"]
    gpu = noise["gpu"]
    extra = {
        n: [x for _, x in r.kern(n) + r.train(n) if "step=" not in x and "iteration" not in x] for n in c.node_names
    }
    plain_extra = {
        n: [x for _, x in p.kern(n) + p.train(n) if "step=" not in x and "iteration" not in x] for n in c.node_names
    }
    for n in c.node_names:
        if n != node:
            assert extra[n] == plain_extra[n]
    if variant == "pcie_replay":
        assert any("AER: Corrected error received" in x for x in extra[node])
        replays = {
            (n, g): r.samples[-1][1][n][g]["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
            - p.samples[-1][1][n][g]["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
            for n in c.node_names
            for g in range(4)
        }
        assert [k for k, x in replays.items() if x] == [(node, gpu)] and replays[node, gpu] >= 4
    elif variant == "nccl_retry":
        assert len([x for x in extra[node] if "NCCL WARN" in x]) == 1
    else:
        assert c.modes.count(NORMAL) == 12
        assert max(d for _, t, d in c.step_history if t > T) > 2.0
    assert c.job.state == "running" and set(c.modes) == {NORMAL}
    assert r.step_lines(after=T + 20)  # training went on


def test_healthy_real_is_healthy_with_every_kind_of_noise() -> None:
    c = Cluster(SimConfig(nodes=4, gpus_per_node=4, scenario="healthy_real", seed=11, start=START_AT))
    r = Run(c).run(600, every=1.0, sample=False)
    gt = c.ground_truth()
    assert gt["faults"] == [] and gt["noise"] == []
    kinds = {e["kind"] for e in gt["realism"]["events"]}
    assert {"checkpoint", "evaluation", "restart", "loader_stall", "loss_spike", "agent_stop", "agent_start"} <= kinds
    assert "agent_late_start" in kinds and gt["realism"]["params"]["checkpoint_every_s"] == 100.0
    assert c.job.state == "running" and r.step_lines(after=590)
    assert json.loads(json.dumps(gt)) == gt


def test_expect_action_for_every_kind() -> None:
    for kind in FAULT_KINDS.values():
        want = "evict" if kind.expect_eviction else "diagnose" if kind.eviction_optional else "none"
        if kind.name == "software_slow":
            want = "diagnose"
        if kind.name in ("gpu_reset", "sram_ecc", "gsp_error"):
            want = "reset_gpu"  # the node keeps working: only its GPU is reset
        if kind.name == "nvswitch_tray_failure" or kind.name in SHARED_FAULT_KINDS:
            want = "cordon"  # the NVLink domain's (a shared component's) fault: its machines cordoned, none evicted
        assert kind.action == want, kind.name
    for name in (
        "two_faults",
        "fault_in_checkpoint",
        "intermittent_straggler",
        "hang_in_checkpoint",
        "software_slow",
        "transient",
        "healthy_real",
    ):
        assert name in SCENARIOS
    assert SCENARIOS["healthy_real"].realism and SCENARIOS["fault_in_checkpoint"].realism
    assert not SCENARIOS["healthy"].realism


def test_realism_params_from_text() -> None:
    p = RealismParams().with_overrides({"checkpoint_every_s": "120", "checkpoint_s": "10,20", "eval_iters": "5"})
    assert (p.checkpoint_every_s, p.checkpoint_s, p.eval_iters) == (120.0, (10.0, 20.0), 5)
    for bad in ({"nope": "1"}, {"checkpoint_s": "20"}, {"checkpoint_s": "30,20"}, {"eval_iters": "x"}, {"day_s": "-1"}):
        with pytest.raises(ValueError):
            RealismParams().with_overrides(bad)


# --- what a rank process shows while saving (lab/sim/rank.py, run in a thread: its stack, no process) ---


class _Ctx:
    """The rank's Context with the mode set by the test instead of a control file."""

    def __init__(self, mode: str) -> None:
        self.rank, self.local_rank, self.step_seconds = 0, 0, 0.01
        self.current = mode

    def mode(self) -> str:
        return self.current

    def run_kernels(self, share: float) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "frames"),
    [
        ("checkpoint", ["train_step", "save_checkpoint", "save", "_save", "write_record"]),
        ("hang_culprit:ckpt", ["train_step", "save_checkpoint", "save", "_save", "write_record"]),
        ("hang_victim:barrier", ["train_step", "save_checkpoint", "barrier", "_wait_for_work"]),
    ],
)
def test_a_rank_saving_shows_the_save_in_its_stack(mode: str, frames: list[str]) -> None:
    import sys
    import threading
    import time

    from lab.sim import rank

    ctx = _Ctx(mode)
    done = threading.Event()

    def step() -> None:
        rank.train_step(ctx, rank.DataLoaderIter(ctx))  # type: ignore[arg-type]
        done.set()

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    time.sleep(0.3)
    frame, names = sys._current_frames()[thread.ident], []  # type: ignore[index]
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    names.reverse()
    assert names[-len(frames) :] == frames and not done.is_set()
    ctx.current = NORMAL  # the save returns (or the peer arrives): the step goes on and ends
    assert done.wait(3.0)


def test_a_scenarios_noise_gives_way_to_the_configs() -> None:
    c = Cluster(SimConfig(scenario="healthy_real", seed=1, start=START_AT))
    assert c.config.realism_params.checkpoint_every_s == 100.0 and c.config.realism_params.first_restart_s == 120.0
    mine = RealismParams(checkpoint_every_s=30.0)
    c = Cluster(SimConfig(scenario="healthy_real", seed=1, start=START_AT, realism_params=mine))
    assert c.config.realism_params.checkpoint_every_s == 30.0 and c.config.realism_params.first_restart_s == 120.0


def test_a_late_agent_is_up_before_the_fault() -> None:
    # fault_after 10 s: no agent may still be waiting to start then (it would miss the fault's lines).
    c = cluster("straggler", late_join_nodes=2, late_join_s=(20.0, 30.0))
    assert all(c.agent_delay(n) == 0 for n in range(3))
    c = cluster("healthy", late_join_nodes=2, late_join_s=(20.0, 30.0))
    assert sorted(c.agent_delay(n) > 0 for n in range(3)) == [False, True, True]


def test_healthy_ranks_leave_the_all_reduce_together_at_step_boundaries() -> None:
    """Synchronous training: whenever a rank arrives at the all-reduce, it leaves at the same moment as every
    other rank (so stacks dumped together show one phase), and never sooner than the collective takes."""
    import time

    from lab.sim import rank

    ctx = _Ctx("normal")
    ctx.step_seconds = 0.4
    step = ctx.step_seconds * rank.STEP_PERIOD_FACTOR
    leaves = []
    for arrive in (0.0, 0.15, 0.25):  # three ranks reaching the collective at different points of a step
        time.sleep(step - time.time() % step + arrive)
        began = time.time()
        rank.all_reduce(ctx, "gradients")  # type: ignore[arg-type]
        leaves.append(time.time())
        assert leaves[-1] - began >= 0.2 * ctx.step_seconds - 0.01  # the collective's own time at least
    phases = [(t + step * rank.OPTIMIZER_SHARE) % step for t in leaves]
    assert all(min(p, step - p) < 0.05 for p in phases), phases  # at a boundary, less the optimizer's share
