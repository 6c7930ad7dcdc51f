"""A simulated machine's answer to a `run_checks` directive in the accelerated-time campaign (in-process, at
simulated time: lab/evaluation/campaign_checks.py): the agent's own check code (agents/checks) run against the
simulated machine instead of NVML, PyTorch and NCCL, so that a fault shows where the real check would find it.
The live simulator runs the agent's real suite instead, against fake NVML and PyTorch fed with the same figures
(lab/sim/gpuanswers.py, lab/sim/fakegpu).

What each check reads:
- nvml_state: `driver.judge` on the GPU's DCGM fields as the simulator last set them (a lost GPU answers nothing;
  a pending row remap, a volatile double-bit error, a narrowed PCIe link, clocks held back by heat all fail there),
  plus the Xid the GPU raised since its last reset (the driver check's "Xid since boot"); a GSP still hung after
  Xid 119/120 fails with a reset as its action (on a real GPU, NVML's recovery action field says the same).
- compute (bf16 GEMM, memory and host-to-device bandwidth, numerics): `compute.measure` and `compute.numerics` on
  `SimCompute`, whose figures are an H100's as PyTorch measures them, each GPU with its own small, stable offset
  and run-to-run noise; a GPU that throttles (straggler, also the intermittent one: a GEMM's heat sets it off) is
  THROTTLE_RATIO slow, a narrowed PCIe link caps host-to-device, a corrupting GPU's GEMM has other bits, and a
  GPU whose kernels hang (the hang faults' GPU) raises, as a CUDA call that timed out.
- allreduce_node: NVLink bus bandwidth, much lower with a bad NVLink (replays and retrains under load).
- ib_port: the node's InfiniBand ports after the checks' traffic: a port down fails, and a port with a flapping
  link or a bad NIC flaps again under that traffic (link_downed, symbol errors grow), and a congested node's
  ports drop packets (port_xmit_discards).
- host (memory available, PSI): `host.judge` on the simulated host's figures.
DCGM is not installed on the simulated machines: `dcgm` is not available, as on a node without DCGM.

The service judges the figures against the fleet (service/checks/service.py, ml/check_criteria.py) exactly as it
judges a real agent's; this module only measures.
"""

from __future__ import annotations

import hashlib
import random
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agents.checks import compute, driver
from agents.checks import host as host_check
from agents.checks.network import CHECK as IB_PORT
from agents.checks.result import CheckResult, not_available
from agents.parsers.xid import lookup
from lab.sim.dcgm_fields import INT64_NOT_SUPPORTED, MODEL_NAME, PCIE_LANE_GBPS, PCIE_MAX_GEN, PCIE_MAX_WIDTH
from lab.sim.fabric import ACTIVE, LINK_UP
from lab.sim.gpu import THROTTLE_RATIO, Gpu
from lab.sim.host import MEM_TOTAL_KIB, SWAP_TOTAL_KIB

if TYPE_CHECKING:
    from lab.sim.model import Cluster

# An H100 SXM as PyTorch measures it (ml/check_criteria.py: bf16 GEMM reaches 740 to 800 of 989 TFLOPS).
GEMM_TFLOPS = 775.0
MEMORY_GBPS = 2950.0
H2D_GBPS_PER_LANE_SHARE = 0.83  # host-to-device reaches ~83% of the link's raw rate
ALLREDUCE_NODE_GBPS = 365.0  # NCCL all-reduce bus bandwidth over NVLink, 8 GPUs, large messages
BAD_NVLINK_SHARE = 0.45  # replays and link retrains under an all-reduce's load
# Each GPU's own offset (silicon, cooling), stable across runs, and each run's noise: a healthy fleet's spread.
GPU_SPREAD = 0.012
RUN_NOISE = 0.006
# Faults that show in a check only through what the machine does under the check's load (the rest show in the
# simulated state itself: fields, ports, host figures).
THROTTLES = frozenset({"straggler", "intermittent_straggler"})
HANGS = frozenset({"hang", "hang_in_checkpoint"})
FLAPS = frozenset({"ib_flap", "ib_port_flap", "ib_port_flap_nccl", "nic_down"})
CONGESTS = frozenset({"ib_congestion"})
XID_RESET = frozenset({119, 120})  # GSP timeouts: NVIDIA's catalog says reset the GPU
LEVEL_CHECKS = {1: ("nvml_state", "host", "dcgm", IB_PORT), 2: ("compute", "allreduce_node")}


def _stable(*parts: object) -> random.Random:
    return random.Random(hashlib.sha256(":".join(map(str, parts)).encode()).digest())


class SimCompute:
    """compute.Compute on one simulated machine: the figures its GPUs would measure now."""

    def __init__(self, cluster: Cluster, machine: int, rng: random.Random) -> None:
        self.cluster, self.machine, self.rng = cluster, machine, rng
        self.gpus = cluster.gpus[machine]
        faults = cluster.faults_on(machine)
        name = cluster.node_names[machine]
        self.throttled = {g for f in faults if f.kind in THROTTLES for g in f.gpus.get(name, [])}
        self.hung = {g for f in faults if f.kind in HANGS for g in f.gpus.get(name, [])}

    def devices(self) -> list[tuple[int, str]]:
        return [(g.index, MODEL_NAME) for g in self.gpus if not g.lost]

    def _figure(self, gpu: int, base: float, check: str) -> float:
        if gpu in self.hung:
            raise RuntimeError(f"CUDA error: the {check} kernel on GPU {gpu} did not finish (timed out)")
        own = 1.0 + _stable(self.gpus[gpu].uuid, check).gauss(0, GPU_SPREAD)
        slow = THROTTLE_RATIO if (gpu in self.throttled or self.gpus[gpu].thermal) else 1.0
        return base * own * slow * (1.0 + self.rng.gauss(0, RUN_NOISE))

    def gemm_tflops(self, gpu: int) -> float:
        return self._figure(gpu, GEMM_TFLOPS, "gemm_bf16")

    def memory_gbps(self, gpu: int) -> float:
        slow = self._figure(gpu, MEMORY_GBPS, "memory_bandwidth")
        # HBM bandwidth barely follows the SM clock: a throttled GPU loses a little of it, not a third.
        return slow / THROTTLE_RATIO * 0.93 if (gpu in self.throttled or self.gpus[gpu].thermal) else slow

    def h2d_gbps(self, gpu: int) -> float:
        g = self.gpus[gpu]
        link = PCIE_LANE_GBPS[g.pcie_gen] * g.pcie_width * H2D_GBPS_PER_LANE_SHARE
        full = PCIE_LANE_GBPS[PCIE_MAX_GEN] * PCIE_MAX_WIDTH * H2D_GBPS_PER_LANE_SHARE
        if gpu in self.hung:
            raise RuntimeError(f"CUDA error: the host-to-device copy to GPU {gpu} did not finish (timed out)")
        return min(link, full * (1.0 + _stable(g.uuid, "h2d").gauss(0, GPU_SPREAD))) * (
            1.0 + self.rng.gauss(0, RUN_NOISE)
        )

    def gemm_digest(self, gpu: int) -> str:
        if gpu in self.hung:
            raise RuntimeError(f"CUDA error: the GEMM on GPU {gpu} did not finish (timed out)")
        if self.gpus[gpu].corrupting:  # wrong bits, different each run: no error raised
            return hashlib.sha256(f"corrupt:{self.rng.random()}".encode()).hexdigest()
        return hashlib.sha256(b"the same GEMM on the same inputs").hexdigest()


def _nvml_state(cluster: Cluster, machine: int) -> list[CheckResult]:
    out = []
    for g in cluster.gpus[machine]:
        values = getattr(g, "values", {})
        # NVML answers "not supported" as no value (DCGM's blank sentinel); a lost GPU answers nothing at all.
        fields: dict[str, float | None] = (
            dict.fromkeys(values or ("DCGM_FI_DEV_GPU_TEMP",), None)
            if g.lost or not values
            else {k: None if v == INT64_NOT_SUPPORTED else float(v) for k, v in values.items()}
        )
        problems, action = driver.judge(fields)
        evidence: dict[str, Any] = {"model": MODEL_NAME, "uuid": g.uuid, "pci_bus_id": g.bus_id}
        info = lookup(g.xid) if g.xid else None
        evidence["xid_since_boot"] = (
            [{"xid": g.xid, "mnemonic": info.mnemonic, "action": info.action}] if info is not None else []
        )
        if g.xid in XID_RESET and not g.lost:  # the GSP still hung: the driver's recovery action says reset
            problems.append(f"the driver asks for a GPU reset (Xid {g.xid}, GSP timeout, since the last reset)")
            action = action or "reset_gpu"
        if problems:
            evidence["problems"], evidence["action"] = problems, action
        out.append(
            CheckResult(
                driver.CHECK,
                f"gpu:{g.index}",
                "fail" if problems else "pass",
                measured=float(len(problems)),
                expected=0.0,
                unit="problems",
                evidence=evidence,
                duration_s=0.4,
            )
        )
    return out


def _host(cluster: Cluster, machine: int) -> list[CheckResult]:
    h = cluster.hosts[machine]
    fields = {
        "mem_total_mib": round(MEM_TOTAL_KIB / 1024, 1),
        "mem_available_mib": round(h.mem_available_kib / 1024, 1),
        "swap_used_mib": round(min(h.swap_kib, SWAP_TOTAL_KIB) / 1024, 1),
        "psi_mem_full_avg10": round(h.psi_mem.full_avg[0], 2),
        "psi_io_full_avg10": round(h.psi_io.full_avg[0], 2),
    }
    return host_check.judge(fields)


def nvlink_busbw(gpus: list[Gpu], rng: random.Random) -> float:
    """The all-reduce bus bandwidth across the node's GPUs (NCCL over NVLink), much lower with a bad NVLink."""
    busbw = ALLREDUCE_NODE_GBPS * (1.0 + rng.gauss(0, RUN_NOISE))
    return busbw * BAD_NVLINK_SHARE if any(g.nvlink_bad for g in gpus) else busbw


def _allreduce_node(cluster: Cluster, machine: int, rng: random.Random) -> CheckResult:
    gpus = [g for g in cluster.gpus[machine] if not g.lost]
    evidence: dict[str, Any] = {"backend": "nccl", "world_size": len(cluster.gpus[machine]), "model": MODEL_NAME}
    if len(cluster.gpus[machine]) < 2:
        return CheckResult("allreduce_node", "node", "not_available", evidence={"reason": "needs two GPUs or more"})
    if len(gpus) < len(cluster.gpus[machine]):
        evidence["errors"] = ["a rank could not open its GPU: CUDA error: no CUDA-capable device is detected"]
        return CheckResult("allreduce_node", "node", "fail", unit="GB/s", evidence=evidence, duration_s=12.0)
    busbw = nvlink_busbw(gpus, rng)
    bad = [g.index for g in gpus if g.nvlink_bad]
    if bad:
        evidence["nvlink_errors_on"] = [f"gpu:{i}" for i in bad]
    return CheckResult("allreduce_node", "node", "pass", round(busbw, 2), None, "GB/s", evidence, 8.0)


def port_growth(cluster: Cluster, machine: int, rng: random.Random) -> dict[str, dict[str, int]]:
    """What the checks' traffic adds to each InfiniBand port's error counters (device -> counter -> count): a
    flapping link or a bad NIC flaps again under it, a congested node's ports drop packets."""
    fabric = cluster.fabrics[machine]
    name = cluster.node_names[machine]
    faults = cluster.faults_on(machine)
    flapping = {g for f in faults if f.kind in FLAPS for g in f.gpus.get(name, [])}
    congested = any(f.kind in CONGESTS for f in faults) or any(p.congested > 0 for p in fabric.ports)
    out = {}
    for p in fabric.ports:
        grew: dict[str, int] = {}
        if p.gpu in flapping and p.state == ACTIVE and p.phys_state == LINK_UP:  # a port down carries no traffic
            grew = {"link_downed": 1, "symbol_error": rng.randint(8, 60), "link_error_recovery": rng.randint(1, 3)}
        if congested:
            grew["port_xmit_discards"] = rng.randint(200, 4000)
        out[p.device] = grew
    return out


def _ib_ports(cluster: Cluster, machine: int, rng: random.Random) -> list[CheckResult]:
    growth = port_growth(cluster, machine, rng)
    out = []
    for p in cluster.fabrics[machine].ports:
        problems = []
        if p.state != ACTIVE:
            problems.append(f"port state {p.state} (4 is ACTIVE)")
        if p.phys_state != LINK_UP:
            problems.append(f"physical state {p.phys_state} (5 is LinkUp)")
        grew = growth[p.device]
        if grew:
            problems.append("error counters grew during the checks: " + ", ".join(f"{k} +{v}" for k, v in grew.items()))
        rate = float(p.rate.split()[0])
        evidence: dict[str, Any] = {
            "rate_gbps": rate,
            "counters": {k: p.counters.get(k, 0) + grew.get(k, 0) for k in grew},
        }
        if problems:
            evidence["problems"] = problems
        out.append(
            CheckResult(IB_PORT, f"ib:{p.device}/1", "fail" if problems else "pass", rate, rate, "Gb/s", evidence)
        )
    return out


def run(
    cluster: Cluster, machine: int, *, level: int, only: list[str] | None = None, seed: int = 0
) -> list[CheckResult]:
    """The level's checks on the simulated machine, in the agent's order (agents/checks/suite.py)."""
    rng = _stable(cluster.node_names[machine], seed, cluster.t)
    plan = [name for lvl in sorted(LEVEL_CHECKS) if lvl <= level for name in LEVEL_CHECKS[lvl]]
    if only is not None:
        plan = [name for name in plan if name in only]
    results: list[CheckResult] = []
    for name in plan:
        if name == "nvml_state":
            results += _nvml_state(cluster, machine)
        elif name == "host":
            results += _host(cluster, machine)
        elif name == "dcgm":
            results.append(not_available("dcgm", "dcgmi is not installed (DCGM host engine absent)"))
        elif name == "compute":
            sim = SimCompute(cluster, machine, rng)
            for check in compute.CHECKS:
                results += compute.run(sim, check)
        elif name == "allreduce_node":
            results.append(_allreduce_node(cluster, machine, rng))
        elif name == IB_PORT:
            results += _ib_ports(cluster, machine, rng)
    return results


def wire(results: list[CheckResult], *, directive_id: str | None, ts: datetime) -> list[dict[str, Any]]:
    """The results as the agent ships them in a batch's `checks` (agents/agent.py)."""
    return [{"ts": ts.isoformat(), "directive_id": directive_id, **r.to_wire()} for r in results]


def refused(why: str, *, directive_id: str | None, ts: datetime) -> list[dict[str, Any]]:
    return [{"ts": ts.isoformat(), "directive_id": directive_id, "refused": why}]
