"""The simulator's machine-level signals (issue 16): each node's fake kernel tree (IB ports, the storage NIC,
/proc) in the kernel's formats, how healthy nodes look in it, what each new fault changes (on the faulty node
or GPU only), their ground truth, and the tree writer (only changed files, atomically, cheap)."""

from __future__ import annotations

import itertools
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lab.sim.config import SimConfig
from lab.sim.dcgm_fields import FIELD_NAMES, PCIE_LANE_GBPS
from lab.sim.fabric import ACTIVE, DOWN, IB_PORTS, INIT
from lab.sim.host import CPUS, MEM_TOTAL_KIB
from lab.sim.kerneltree import NodeTree, TreeWriter
from lab.sim.model import Cluster
from lab.sim.runner import SimRunner, _remove_orphan_trees
from ml.metrics import FIELD_TO_COLUMN

START = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)
T = 10.0  # fault_after
ERROR_WORDS = ("Xid", "WARN", "Error", "error", "Traceback", "Watchdog", "FAILED", "Link down")
IB = "sys/class/infiniband"
NETDEV = "sys/class/net/enp170s0f0np0"


def cluster(scenario: str, *, nodes: int = 3, gpus: int = 4, seed: int = 11) -> Cluster:
    return Cluster(SimConfig(nodes=nodes, gpus_per_node=gpus, scenario=scenario, seed=seed, fault_after=T, start=START))


def files(c: Cluster, node: int) -> dict[str, str]:
    return NodeTree(c.node_names[node], c.hosts[node], c.fabrics[node]).files()


def counter(tree: dict[str, str], dev: str, name: str, hw: bool = False) -> int:
    return int(tree[f"{IB}/{dev}/ports/1/{'hw_counters' if hw else 'counters'}/{name}"])


def ethtool(tree: dict[str, str]) -> dict[str, int]:
    lines = tree[f"{NETDEV}/ethtool_stats"].splitlines()
    assert lines[0] == "NIC statistics:"
    return {k: int(v) for k, v in (re.fullmatch(r" {5}(\w+): (\d+)", line).groups() for line in lines[1:])}  # type: ignore[union-attr]


def meminfo(tree: dict[str, str]) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^([\w()]+):\s+(\d+)", tree["proc/meminfo"], re.M)}


def psi(tree: dict[str, str], resource: str) -> dict[str, float]:
    """{"some avg10": .., "full total": ..} from one /proc/pressure file."""
    out = {}
    for line in tree[f"proc/pressure/{resource}"].splitlines():
        kind, *pairs = line.split()
        out |= {f"{kind} {k}": float(v) for k, v in (p.split("=") for p in pairs)}
    return out


def cpu_shares(before: dict[str, str], after: dict[str, str]) -> dict[str, float]:
    """Busy and iowait shares of all CPUs between two /proc/stat readings, as a collector computes them."""

    def total(tree: dict[str, str]) -> list[int]:
        first = tree["proc/stat"].splitlines()[0].split()
        assert first[0] == "cpu"
        return [int(x) for x in first[1:]]

    d = [b - a for a, b in zip(total(before), total(after), strict=True)]
    idle, iowait, steal = d[3], d[4], d[7]
    all_ = sum(d[:8])
    return {"busy": (all_ - idle - iowait) / all_, "iowait": iowait / all_, "steal": steal / all_}


@dataclass
class Run:
    """A model run keeping each node's tree every second (what an agent sampling once a second would see)."""

    c: Cluster
    trees: list[list[dict[str, str]]]  # [second][node]
    lines: list[tuple[float, str, str, str]]

    @classmethod
    def of(cls, scenario: str, until: float, **kw: int) -> Run:
        c = cluster(scenario, **kw)
        trees, lines = [], []
        for t in range(1, int(until) + 1):
            lines += [(float(t), x.node, x.stream, x.text) for x in c.advance(t)]
            trees.append([files(c, n) for n in range(c.config.nodes)])
        return cls(c, trees, lines)

    def at(self, t: float, node: int) -> dict[str, str]:
        return self.trees[int(t) - 1][node]

    def rate(self, node: int, key: str, a: float, b: float) -> float:
        """Growth per second of one file's integer value between two times."""
        return (int(self.at(b, node)[key]) - int(self.at(a, node)[key])) / (b - a)

    def text(self, after: float = 0.0) -> str:
        return "\n".join(x for t, _, _, x in self.lines if t > after)

    def mean_step(self, a: float, b: float) -> float:
        return statistics.mean(d for _, t, d in self.c.step_history if a <= t < b)

    def fault(self) -> tuple[int, int | None]:
        f = self.c.faults[0]
        node = self.c.node_names.index(f.nodes[0])
        return node, (f.gpus[f.nodes[0]][0] if f.gpus else None)


def port_key(dev: str, name: str, hw: bool = False) -> str:
    return f"{IB}/{dev}/ports/1/{'hw_counters' if hw else 'counters'}/{name}"


PMA_WIDTHS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}
ERROR_COUNTERS = (
    "link_downed",
    "link_error_recovery",
    "symbol_error",
    "port_rcv_errors",
    "local_link_integrity_errors",
)


# --- the healthy tree ---


def test_healthy_tree_is_formatted_as_the_kernel_does() -> None:
    c = cluster("healthy")
    c.advance(20)
    tree = files(c, 1)
    ports = sorted({m[1] for p in tree if (m := re.match(rf"{IB}/(mlx5_\d+)/ports/1/state$", p))})
    assert ports == [f"mlx5_{i}" for i in range(IB_PORTS + 1)]
    for i in range(IB_PORTS):
        base = f"{IB}/mlx5_{i}/ports/1"
        assert tree[f"{base}/state"] == "4: ACTIVE\n"
        assert tree[f"{base}/phys_state"] == "5: LinkUp\n"
        assert tree[f"{base}/rate"] == "400 Gb/sec (4X NDR)\n"
        assert tree[f"{base}/link_layer"] == "InfiniBand\n"
    assert tree[f"{IB}/mlx5_8/ports/1/link_layer"] == "Ethernet\n"
    assert f"{IB}/mlx5_8/device/net/enp170s0f0np0/" in tree  # the RoCE port's netdev
    assert any(p.startswith(f"{NETDEV}/device/") for p in tree) and not any("/lo/device" in p for p in tree)
    for path, text in tree.items():
        if "/counters/" in path or "/hw_counters/" in path or "/statistics/" in path or path.endswith("_count"):
            assert re.fullmatch(r"\d+\n", text), path
    for name in ("np_cnp_sent", "rp_cnp_handled", "out_of_buffer"):
        assert f"{IB}/mlx5_0/ports/1/hw_counters/{name}" in tree
    for dev in ports:  # the PMA PortCounters fields saturate at their width (drivers/infiniband/core/sysfs.c)
        for name, bits in PMA_WIDTHS.items():
            assert counter(tree, dev, name) < (1 << bits) - 1, (dev, name)

    stat = tree["proc/stat"].splitlines()
    assert re.fullmatch(r"cpu  \d+( \d+){9}", stat[0])
    per_cpu = [line for line in stat if re.match(r"cpu\d", line)]
    assert len(per_cpu) == CPUS and all(re.fullmatch(r"cpu\d+( \d+){10}", line) for line in per_cpu)
    assert [int(x) for x in stat[0].split()[1:]] == [
        sum(int(line.split()[i]) for line in per_cpu) for i in range(1, 11)
    ], "the cpu line sums the CPUs"
    assert re.search(r"^btime \d{10}$", tree["proc/stat"], re.M)
    assert re.search(r"^procs_blocked [01]$", tree["proc/stat"], re.M)

    for line in tree["proc/meminfo"].splitlines():
        assert re.fullmatch(r"[\w()]+: +\d+( kB)?", line), line
        if line.endswith(" kB") and not line.startswith("HardwareCorrupted"):
            assert len(line) >= 16 + 8 + 3 and line[15] in ": "  # label in 16 columns, value in 8 or more
    mem = meminfo(tree)
    assert mem["MemTotal"] == MEM_TOTAL_KIB and 0.5 < mem["MemAvailable"] / mem["MemTotal"] < 0.95
    assert mem["MemFree"] < mem["MemAvailable"] and mem["SwapFree"] <= mem["SwapTotal"]
    assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d \d+/\d+ \d+\n", tree["proc/loadavg"])
    for resource in ("cpu", "memory", "io"):
        line = r"(some|full) avg10=\d+\.\d\d avg60=\d+\.\d\d avg300=\d+\.\d\d total=\d+\n"
        assert re.fullmatch(line * 2, tree[f"proc/pressure/{resource}"])
    irq = tree["proc/interrupts"].splitlines()
    assert irq[0].split() == [f"CPU{i}" for i in range(CPUS)]
    mce = next(line for line in irq if line.lstrip().startswith("MCE:"))
    assert re.fullmatch(rf" MCE:( +\d+){{{CPUS}}}   Machine check exceptions", mce)
    assert re.fullmatch(
        r"NVRM version: NVIDIA UNIX x86_64 Kernel Module  550\.90\.07  .+\nGCC version:  .+\n",
        tree["proc/driver/nvidia/version"],
    )
    stats = ethtool(tree)
    assert {"rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "rx_prio3_pause", "tx_prio3_pause"} <= set(stats)
    assert stats["rx_bytes"] == int(tree[f"{NETDEV}/statistics/rx_bytes"])
    assert re.fullmatch(r"\d+\n", tree["sys/devices/system/edac/mc/mc7/ce_count"])


def test_healthy_nodes_look_healthy_and_alike_but_not_identical() -> None:
    run = Run.of("healthy", 70)
    waits: list[float] = []
    for n in range(3):
        a, b = run.at(10, n), run.at(70, n)
        for i in range(IB_PORTS):
            dev = f"mlx5_{i}"
            for name in ERROR_COUNTERS:
                assert counter(a, dev, name) == counter(b, dev, name), f"node {n} {dev} {name} stepped"
            assert b[f"{IB}/{dev}/ports/1/state"] == "4: ACTIVE\n"
            if i < 4:  # the four GPUs of the job all-reduce over their NICs (the other rails idle)
                words = counter(b, dev, "port_xmit_data") - counter(a, dev, "port_xmit_data")
                assert 60 * 5e9 < 4 * words < 60 * 46e9, "bytes grow with the job's communication"
                waits.append(run.rate(n, port_key(dev, "port_xmit_wait"), 10, 70))
                cnp = counter(b, dev, "np_cnp_sent", hw=True) - counter(a, dev, "np_cnp_sent", hw=True)
                assert cnp <= 10
            else:
                assert counter(a, dev, "port_xmit_data") == counter(b, dev, "port_xmit_data")
        pause_a, pause_b = ethtool(a), ethtool(b)
        for name in ("rx_prio3_pause", "tx_prio3_pause", "rx_pause_ctrl_phy", "tx_pause_ctrl_phy"):
            assert pause_b[name] - pause_a[name] <= 2
        assert psi(b, "memory")["some avg10"] == 0 and psi(b, "memory")["full total"] == 0
        assert psi(b, "cpu")["some avg10"] < 5 and psi(b, "io")["some avg10"] < 2
        mem_a, mem_b = meminfo(a), meminfo(b)
        assert mem_b["MemAvailable"] / mem_b["MemTotal"] > 0.5
        assert mem_a["SwapFree"] == mem_b["SwapFree"], "no swapping"
        shares = cpu_shares(a, b)
        assert 0.1 < shares["busy"] < 0.4 and shares["iowait"] < 0.01 and shares["steal"] == 0
        assert re.search(r"^procs_blocked [01]$", b["proc/stat"], re.M)
    # Peers alike (no port a detector would call an outlier), yet each its own.
    median = statistics.median(waits)
    assert all(median / 4 < w < median * 4 for w in waits) and len(set(waits)) == len(waits)
    avail = [meminfo(run.at(70, n))["MemAvailable"] for n in range(3)]
    assert len(set(avail)) == 3
    assert not any(w in run.text(after=1) for w in ERROR_WORDS)


def test_same_seed_same_tree_whatever_the_call_pattern() -> None:
    a, b = cluster("ib_port_flap", seed=5), cluster("ib_port_flap", seed=5)
    a.advance(25)
    t = 0.0
    while t < 25:
        t = min(25.0, t + 0.37)
        b.advance(t)
    assert files(a, 0) == files(b, 0) and files(a, 2) == files(b, 2)
    assert files(cluster("healthy", seed=6), 0) != files(cluster("healthy", seed=5), 0)


# --- the faults ---


def flap_episodes(run: Run, node: int, dev: str) -> list[tuple[int, int]]:
    """(first second down, seconds until ACTIVE again) of each time the port left ACTIVE."""
    states = [int(run.trees[s][node][f"{IB}/{dev}/ports/1/state"][0]) for s in range(len(run.trees))]
    episodes, start = [], None
    for s, state in enumerate(states):
        if state != ACTIVE and start is None:
            start = s
        elif state == ACTIVE and start is not None:
            episodes.append((start + 1, s - start))
            start = None
    return episodes


@pytest.mark.parametrize("scenario", ["ib_port_flap", "ib_port_flap_nccl"])
def test_ib_port_flaps(scenario: str) -> None:
    run = Run.of(scenario, T + 90)
    node, gpu = run.fault()
    assert gpu is not None
    dev = f"mlx5_{gpu}"
    episodes = flap_episodes(run, node, dev)
    assert len(episodes) == 3, episodes
    assert all(3 <= length <= 7 for _, length in episodes) and episodes[0][0] >= T and episodes[-1][0] <= T + 65
    seen = {run.trees[s][node][f"{IB}/{dev}/ports/1/state"] for s in range(len(run.trees))}
    assert {f"{DOWN}: DOWN\n", f"{INIT}: INIT\n", f"{ACTIVE}: ACTIVE\n"} <= seen
    phys = {run.trees[s][node][f"{IB}/{dev}/ports/1/phys_state"] for s in range(len(run.trees))}
    assert phys == {"5: LinkUp\n", "2: Polling\n"}
    before, after = run.at(T - 1, node), run.at(T + 90, node)
    assert counter(after, dev, "link_downed") - counter(before, dev, "link_downed") == 3
    assert 3 <= counter(after, dev, "link_error_recovery") - counter(before, dev, "link_error_recovery") <= 9
    assert counter(after, dev, "symbol_error") > counter(before, dev, "symbol_error")
    for n in range(3):  # every other port of the cluster: no step at all
        for i in range(IB_PORTS):
            if (n, i) != (node, gpu):
                for name in ERROR_COUNTERS:
                    assert counter(run.at(T - 1, n), f"mlx5_{i}", name) == counter(run.at(T + 90, n), f"mlx5_{i}", name)
    # The job stalls a few seconds per flap (NCCL retries), and goes on.
    steps = [t for _, t, _ in run.c.step_history if t > T - 3]
    gaps = sorted(b - a for a, b in itertools.pairwise(steps))
    assert len([g for g in gaps if g > 3]) >= 3 and run.c.job.state == "running" and steps[-1] > T + 85
    text = run.text(after=T)
    assert "Link down" not in text and "Traceback" not in text and "Watchdog" not in text
    warns = [x for t, n, _, x in run.lines if "NCCL WARN NET/IB" in x and "with error 12" in x]
    if scenario == "ib_port_flap":
        assert not any(w in text for w in ERROR_WORDS), "the counters are the only evidence"
    else:
        assert len(warns) == 3 and all(n == run.c.node_names[node] for _, n, _, x in run.lines if "NCCL WARN" in x)


def test_ib_flap_moves_the_port_counters_too() -> None:
    run = Run.of("ib_flap", T + 55)
    node, gpu = run.fault()
    dev = f"mlx5_{gpu}"
    assert counter(run.at(T + 55, node), dev, "link_downed") - counter(run.at(T - 1, node), dev, "link_downed") == 2
    assert len(flap_episodes(run, node, dev)) == 2


def test_ib_congestion() -> None:
    run = Run.of("ib_congestion", T + 60)
    node, gpu = run.fault()
    assert gpu is None and run.c.faults[0].gpus == {}
    a, b = T + 5, T + 60
    waits = {
        (n, i): run.rate(n, port_key(f"mlx5_{i}", "port_xmit_wait"), a, b) for n in range(3) for i in range(4)
    }  # fmt: skip
    peers = statistics.median(w for (n, _), w in waits.items() if n != node)
    assert all(w > 50 * peers for (n, _), w in waits.items() if n == node)
    assert all(w < 5 * peers for (n, _), w in waits.items() if n != node)
    # Even ~100x faster, the 32-bit counter stays clear of its maximum for far longer than any scenario.
    assert all(
        counter(run.at(b, node), f"mlx5_{i}", "port_xmit_wait") + 600 * waits[(node, i)] < 2**32 for i in range(4)
    )
    for n in range(3):
        pause = {k: ethtool(run.at(b, n))[k] - ethtool(run.at(a, n))[k] for k in ("tx_prio3_pause", "rx_prio3_pause")}
        cnp = run.rate(n, port_key("mlx5_0", "np_cnp_sent", hw=True), a, b) * (b - a)
        if n == node:
            assert pause["tx_prio3_pause"] > 1000 * (b - a) and pause["rx_prio3_pause"] > 100 * (b - a)
            assert cnp > 100 * (b - a)
        else:
            assert pause["tx_prio3_pause"] <= 2 and pause["rx_prio3_pause"] <= 2 and cnp <= 10
    assert 1.2 <= run.mean_step(T + 2, T + 60) / run.mean_step(0, T) <= 1.45
    assert not any(w in run.text(after=1) for w in ERROR_WORDS)


def test_pcie_downgrade() -> None:
    c = cluster("pcie_downgrade")
    c.advance(T + 1)
    f = c.faults[0]
    name, gpu = f.nodes[0], f.gpus[f.nodes[0]][0]
    peak: dict[tuple[str, int], float] = {}
    t = T + 1.0
    while t < T + 40:
        t += 0.1
        c.advance(t)
        for node, samples in c.snapshot().items():
            for g in samples:
                key = (node, g.index)
                peak[key] = max(peak.get(key, 0.0), g.values["DCGM_FI_PROF_PCIE_TX_BYTES"])
    for node, samples in c.snapshot().items():
        for g in samples:
            v = g.values
            assert (v["DCGM_FI_DEV_PCIE_MAX_LINK_GEN"], v["DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"]) == (5, 16)
            current = (v["DCGM_FI_DEV_PCIE_LINK_GEN"], v["DCGM_FI_DEV_PCIE_LINK_WIDTH"])
            if (node, g.index) == (name, gpu):
                assert current in ((5, 8), (3, 16))
            else:
                assert current == (5, 16)
    gen, width = c.gpus[c.node_names.index(name)][gpu].pcie_gen, c.gpus[c.node_names.index(name)][gpu].pcie_width
    cap = 0.85e9 * PCIE_LANE_GBPS[gen] * width
    others = [p for k, p in peak.items() if k != (name, gpu)]
    assert peak[(name, gpu)] <= 1.2 * cap < 1.2 * min(others), "its PCIe throughput is capped by the link"
    steps = [d for _, t, d in c.step_history]
    before = statistics.mean(d for _, t, d in c.step_history if t < T)
    after = statistics.mean(d for _, t, d in c.step_history if t > T + 2)
    assert steps and 1.08 <= after / before <= 1.25


def test_host_mem_pressure() -> None:
    run = Run.of("host_mem_pressure", T + 70)
    node, gpu = run.fault()
    assert gpu is None
    fault = run.c.ground_truth()["faults"][0]
    assert fault["blame"] == "unknown" and fault["expect_eviction"] is False and fault["eviction_optional"] is True
    a, b = T + 50, T + 70
    for n in range(3):
        mem, pressure, io = meminfo(run.at(b, n)), psi(run.at(b, n), "memory"), psi(run.at(b, n), "io")
        shares = cpu_shares(run.at(a, n), run.at(b, n))
        if n == node:
            assert mem["MemAvailable"] / mem["MemTotal"] < 0.04
            healthy = meminfo(run.at(T - 1, n))
            assert mem["SwapFree"] < healthy["SwapFree"] - 1024 * 1024, "over a GiB more in swap"
            assert 15 <= pressure["some avg10"] <= 70 and 0 < pressure["full avg10"] < pressure["some avg10"]
            assert io["some avg10"] > 5
            assert shares["iowait"] > 0.02
            assert int(re.search(r"procs_blocked (\d+)", run.at(b, n)["proc/stat"])[1]) > 10  # type: ignore[index]
        else:
            assert mem["MemAvailable"] / mem["MemTotal"] > 0.5
            assert pressure["some avg10"] == 0 and io["some avg10"] < 2 and shares["iowait"] < 0.01
    # Its ranks compute slower, so the whole synchronous job is ~20% slower.
    assert 1.1 <= run.mean_step(T + 30, T + 70) / run.mean_step(0, T) <= 1.3
    assert not any(w in run.text(after=1) for w in ERROR_WORDS)


def test_row_remap_pending() -> None:
    c = cluster("row_remap_pending")
    c.advance(T - 0.5)
    before = {(n, g.index): dict(g.values) for n, s in c.snapshot().items() for g in s}
    lines = c.advance(T + 30)
    f = c.faults[0]
    name, gpu = f.nodes[0], f.gpus[f.nodes[0]][0]
    for node, samples in c.snapshot().items():
        for g in samples:
            old, new = before[(node, g.index)], g.values
            if (node, g.index) == (name, gpu):
                assert new["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
                assert new["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == old["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] + 1
                assert new["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] > old["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"]
            else:
                assert new["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 0
                for k in ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"):
                    assert new[k] == old[k]
            assert new["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0 and new["DCGM_FI_DEV_XID_ERRORS"] == 0
    assert not [x for x in lines if x.stream == "kern"] or not any("Xid" in x.text for x in lines)
    ratio = statistics.mean(d for _, t, d in c.step_history if t > T) / statistics.mean(
        d for _, t, d in c.step_history if t < T
    )
    assert 0.95 <= ratio <= 1.05, "the job trains on normally"


@pytest.mark.parametrize(
    ("scenario", "scope", "blame", "evict", "optional"),
    [
        ("ib_port_flap", "gpu", "infrastructure", True, False),
        ("ib_port_flap_nccl", "gpu", "infrastructure", True, False),
        ("ib_congestion", "node", "infrastructure", True, False),
        ("pcie_downgrade", "gpu", "infrastructure", True, False),
        ("host_mem_pressure", "node", "unknown", False, True),
        ("row_remap_pending", "gpu", "infrastructure", True, False),
    ],
)
def test_ground_truth_of_the_new_faults(scenario: str, scope: str, blame: str, evict: bool, optional: bool) -> None:
    c = cluster(scenario, seed=3)
    c.advance(T + 1)
    (fault,) = c.ground_truth()["faults"]
    assert fault["kind"] == scenario and len(fault["nodes"]) == 1
    node = fault["nodes"][0]
    index = c.node_names.index(node)
    if scope == "gpu":
        (gpu,) = fault["gpus"][node]
        assert fault["ranks"] == [index * 4 + gpu]
    else:
        assert fault["gpus"] == {} and fault["ranks"] == [index * 4 + g for g in range(4)]
    assert (fault["blame"], fault["expect_eviction"], fault["eviction_optional"]) == (blame, evict, optional)


def test_a_bounded_demo_injects_no_fault_it_would_end_before_seeing_through() -> None:
    config = SimConfig(nodes=2, gpus_per_node=4, scenario="demo", seed=2, fault_after=60, fault_every=180, start=START)
    c = Cluster(replace(config, duration=1800.0))
    for t in range(1, 1801, 5):
        c.advance(t)
    # 60, 240, ..., 1500: the next, at 1680, would have 2 minutes, less than a fault's period
    assert [round(f.t) for f in c.faults] == list(range(60, 1501, 180))


def test_a_repair_puts_the_node_right() -> None:
    c = Cluster(
        SimConfig(nodes=2, gpus_per_node=4, scenario="demo", seed=2, fault_after=5, fault_every=30, start=START)
    )
    for t in range(1, 121):
        c.advance(t)
    kinds = [f.kind for f in c.faults]
    assert len(kinds) == 4 and all(f.repaired_at for f in c.faults[:3])
    for fab, host in zip(c.fabrics, c.hosts, strict=True):
        assert all(p.state == ACTIVE for p in fab.ports) and host.pressure_target == 0


# --- the writer ---


def test_writer_rewrites_only_changed_files_atomically(tmp_path: Path) -> None:
    c = cluster("healthy", nodes=1)
    c.advance(3)
    tree, writer = NodeTree("node-000", c.hosts[0], c.fabrics[0]), TreeWriter(tmp_path)
    first = tree.files()
    assert writer.sync(first) == sum(1 for p in first if not p.endswith("/"))
    assert (tmp_path / f"{IB}/mlx5_8/device/net/enp170s0f0np0").is_dir()
    assert (tmp_path / "proc/pressure/memory").read_text() == first["proc/pressure/memory"]
    assert writer.sync(tree.files()) == 0, "nothing changed, nothing written"
    state = tmp_path / f"{IB}/mlx5_0/ports/1/state"
    data = tmp_path / f"{IB}/mlx5_0/ports/1/counters/port_xmit_data"
    inode_state, inode_data = state.stat().st_ino, data.stat().st_ino
    c.fabrics[0].flap_down(0, c.node_rng)
    second = tree.files()
    changed = {p for p in second if second[p] != first[p]}
    assert writer.sync(second) == len(changed) and f"{IB}/mlx5_0/ports/1/state" in changed
    assert state.read_text() == "1: DOWN\n" and state.stat().st_ino != inode_state, "replaced, not rewritten in place"
    assert data.stat().st_ino == inode_data, "an unchanged file is left alone"
    assert not [p for p in tmp_path.rglob("*") if "tmp" in p.name]


def test_a_second_of_healthy_training_changes_few_files() -> None:
    # What bounds the tree's cost: per node and second, ~55 of its ~640 files change (measured in the report).
    c = cluster("healthy", nodes=2, gpus=8)
    c.advance(30)
    before = files(c, 0)
    c.advance(31)
    after = files(c, 0)
    changed = [p for p in after if after[p] != before[p]]
    assert 20 <= len(changed) <= 70 and len(after) > 500


@pytest.mark.slow
def test_runner_lays_out_the_trees_and_cleans_up(tmp_path: Path) -> None:
    config = SimConfig(nodes=2, gpus_per_node=2, scenario="healthy", seed=4, dir=tmp_path, agents=False)
    stop = threading.Event()
    runner = SimRunner(config, stop=stop, out=open("/dev/null", "w"))  # noqa: SIM115
    thread = threading.Thread(target=runner.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        state = tmp_path / "node-001/sys/class/infiniband/mlx5_1/ports/1/state"
        deadline = time.monotonic() + 20
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state.read_text() == "4: ACTIVE\n"
        data = tmp_path / "node-001/sys/class/infiniband/mlx5_1/ports/1/counters/port_xmit_data"
        first = int(data.read_text())
        deadline = time.monotonic() + 10
        while int(data.read_text()) == first and time.monotonic() < deadline:
            time.sleep(0.2)
        assert int(data.read_text()) > first, "the tree follows the model"
        assert (tmp_path / "node-000/proc/pressure/io").read_text().startswith("some avg10=")
        shm = runner._tree_shm
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    if shm is not None:
        assert not shm.exists() and not (tmp_path / "node-000/sys").exists()
    assert runner.tree_stats["syncs"] >= 2


def test_trees_of_dead_simulators_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"faultline-sim-{dead.pid}-x1"
    live = tmp_path / f"faultline-sim-{os.getppid()}-x2"
    other = tmp_path / "else"
    for path in (orphan, live, other):
        (path / "node-000/sys").mkdir(parents=True)
    _remove_orphan_trees(tmp_path)
    assert not orphan.exists() and live.exists() and other.exists()


def test_the_new_gpu_fields_are_ones_the_service_stores() -> None:
    # The service keeps only the DCGM names ml/metrics.py maps to a column; these must not be dropped.
    new = {
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    }
    assert new <= FIELD_NAMES
    assert new <= set(FIELD_TO_COLUMN)
