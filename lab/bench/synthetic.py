"""Agent-shaped batches from a synthetic synchronous training job: demo traffic and benchmark load.

Counters are correlated the way they are on a busy GPU (utilization drives power, temperature and
clocks) with per-GPU noise. This is load, not a fault simulator: the only faults are the two the scale
eval injects (a thermally throttled GPU, and a GPU fallen off the bus with its Xid 79 line), shaped as
lab/sim/ shapes them; faultline sim has the full physics.
"""

from __future__ import annotations

import logging
import math
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson

from agents.parsers.kernel import KernelLogParser
from lab.sim import logformat as fmt
from lab.sim.dcgm_fields import PCI_BUSES, SM_CLOCK_MAX_MHZ
from lab.sim.gpu import IDLE_W, THROTTLE_RATIO

log = logging.getLogger(__name__)

# 24 fields: dcgm-exporter's default counters plus the profiling ones peer comparison uses.
GAUGES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
)
COUNTERS = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_DEV_XID_ERRORS",
)
FIELD_COUNT = len(GAUGES) + len(COUNTERS)
# Agents snapshot training processes this often: they change slowly, and at one per GPU per second they
# would double the rows ingest writes.
PROCESS_EVERY_S = 5.0
TOTAL_ITERS = 100_000


def process_every(ship_interval: float) -> int:
    """Every how many batches an agent shipping every `ship_interval` seconds sends process snapshots."""
    return max(1, round(PROCESS_EVERY_S / ship_interval))


def sample_times(now: datetime, *, interval: float, samples: int) -> list[datetime]:
    """When a batch's samples were taken: `samples` scrapes `interval` apart, the last one at `now`."""
    return [now - timedelta(seconds=(samples - 1 - k) * interval) for k in range(samples)]


def step_log(*, ts: datetime, step: int, rank: int, step_s: float) -> dict[str, Any]:
    """A Megatron step line as the agent ships it: the line and the fields its progress parser reads."""
    loss = 3.2 / (1 + step / 5000)
    return {
        "ts": ts.isoformat(),
        "source": "training",
        "kind": "step",
        "severity": "info",
        "rank": rank,
        "line": f" iteration {step:8d}/{TOTAL_ITERS:8d} | elapsed time per iteration (ms): {1000 * step_s:.1f} | "
        f"lm loss: {loss:.6E} |",
        "fields": {"step": step, "total": TOTAL_ITERS, "elapsed_ms": round(1000 * step_s, 1), "loss": loss},
    }


def pci_bus(gpu: int) -> int:
    """The GPU's PCI bus number, numbered as lab/sim/gpu.py numbers them (a DGX H100's eight, then on)."""
    return PCI_BUSES[gpu % len(PCI_BUSES)] + 2 * (gpu // len(PCI_BUSES))


def xid_log(*, ts: datetime, node: str, gpu: int, xid: int = 79) -> dict[str, Any]:
    """A fatal Xid kernel line, turned into its event by the agent's own kernel-log parser (so the service
    gets exactly what an agent would ship: kind xid, severity critical, the catalog's fields)."""
    text = fmt.xid(pci_bus(gpu), xid, "GPU has fallen off the bus.")
    events = KernelLogParser().feed(f"{ts.isoformat()} {node} kernel: {text}", now=ts)
    if len(events) != 1:
        raise ValueError(f"the kernel parser made {len(events)} events of an Xid line")
    return events[0].to_wire()


class SyntheticNode:
    """One node of the job: its GPUs' counters advance with every sample.

    `throttled` GPUs are thermally throttled the way lab/sim/gpu.py shapes one: SM clock at
    THROTTLE_RATIO of its boost, dynamic power down by THROTTLE_RATIO**1.5, held at its slowdown
    temperature; they keep computing (tensor activity a little up per clock, as the simulator has it), so
    what gives them away is power, clock and temperature. `lost` GPUs have fallen off the bus: no samples.
    """

    def __init__(self, name: str, *, index: int, gpus: int, job_id: str, world_size: int, seed: int = 0) -> None:
        self.name = name
        self.index = index
        self.gpus = gpus
        self.job_id = job_id
        self.world_size = world_size
        self.rng = random.Random(seed * 7919 + index)
        self.energy = [self.rng.uniform(1e9, 2e9) for _ in range(gpus)]
        self.bytes = [0.0] * gpus
        self.throttled: set[int] = set()
        self.lost: set[int] = set()
        self.step = 0
        self.batches = 0
        self.started = time.time()

    def sample(self, gpu: int, ts: datetime, *, interval: float) -> dict[str, Any]:
        """One scrape of one GPU: DCGM field values, correlated and noisy."""
        phase = math.sin(ts.timestamp() / 7.0)  # the whole job breathes together
        util = min(100.0, max(0.0, 92 + 5 * phase + self.rng.gauss(0, 1.5)))
        power = 300 + 3.5 * util + self.rng.gauss(0, 6)
        sm_clock = 1980 - round(self.rng.random() * 15)
        gpu_temp = 45 + util * 0.25 + self.rng.gauss(0, 0.7)
        mem_temp = 50 + util * 0.2 + self.rng.gauss(0, 0.7)
        tensor = util / 100 * 0.6 + self.rng.gauss(0, 0.01)
        if gpu in self.throttled:
            power = IDLE_W + (power - IDLE_W) * THROTTLE_RATIO**1.5
            sm_clock = round(SM_CLOCK_MAX_MHZ * THROTTLE_RATIO + self.rng.gauss(0, 18))
            gpu_temp = 87.0 + self.rng.gauss(0, 0.4)
            mem_temp = gpu_temp + 5.0
            tensor *= THROTTLE_RATIO**-0.1
        self.energy[gpu] += power * interval * 1000
        self.bytes[gpu] += util * 2.5e8 * interval
        values = {
            "DCGM_FI_DEV_GPU_UTIL": round(util),
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(util * 0.45 + self.rng.gauss(0, 2)),
            "DCGM_FI_DEV_SM_CLOCK": sm_clock,
            "DCGM_FI_DEV_MEM_CLOCK": 2619,
            "DCGM_FI_DEV_GPU_TEMP": round(gpu_temp),
            "DCGM_FI_DEV_MEMORY_TEMP": round(mem_temp),
            "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
            "DCGM_FI_DEV_FB_FREE": 12_000 + gpu,
            "DCGM_FI_DEV_FB_USED": 69_000 - gpu,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100 * 0.98, 4),
            "DCGM_FI_PROF_SM_ACTIVE": round(util / 100 * 0.9, 4),
            "DCGM_FI_PROF_SM_OCCUPANCY": round(util / 100 * 0.55, 4),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(tensor, 4),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(util / 100 * 0.5 + self.rng.gauss(0, 0.01), 4),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(self.energy[gpu]),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(self.bytes[gpu]),
            "DCGM_FI_PROF_PCIE_TX_BYTES": round(util * 1.1e7),
            "DCGM_FI_PROF_PCIE_RX_BYTES": round(util * 1.3e7),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": round(util * 2.1e9),
            "DCGM_FI_PROF_NVLINK_RX_BYTES": round(util * 2.1e9),
            "DCGM_FI_DEV_XID_ERRORS": 0,
        }
        return {"ts": ts.isoformat(), "gpu": gpu, "fields": values}

    def processes(self, ts: datetime) -> list[dict[str, Any]]:
        return [
            {
                "ts": ts.isoformat(),
                "pid": 10_000 + self.index * 100 + local,
                "job_id": self.job_id,
                "rank": self.index * self.gpus + local,
                "local_rank": local,
                "group_rank": self.index,
                "world_size": self.world_size,
                "cpu_pct": round(100 + self.rng.gauss(0, 5), 1),
                "rss_bytes": 8_000_000_000,
                "state": "R",
            }
            for local in range(self.gpus)
        ]

    def batch(
        self,
        now: datetime | None = None,
        *,
        interval: float = 1.0,
        samples: int = 1,
        logs: Any = None,
        with_processes: bool | None = None,
    ) -> dict[str, Any]:
        """One agent batch: `samples` scrapes of every GPU, `interval` seconds apart, the last at `now`.

        `logs` replaces the default (node 0 logs one step line per scrape); process snapshots come every
        PROCESS_EVERY_S of covered time unless `with_processes` says otherwise.
        """
        now = now or datetime.now(UTC)
        times = sample_times(now, interval=interval, samples=samples)
        metrics = [
            self.sample(gpu, ts, interval=interval) for ts in times for gpu in range(self.gpus) if gpu not in self.lost
        ]
        if with_processes is None:
            with_processes = self.batches % process_every(interval * samples) == 0
        self.batches += 1
        if logs is None:
            logs = []
            for ts in times:
                self.step += 1
                if self.index == 0:
                    logs.append(step_log(ts=ts, step=self.step, rank=0, step_s=interval))
        return {
            "batch_id": str(uuid.uuid4()),
            "node": self.name,
            "sent_at": now.isoformat(),
            "job_id": self.job_id,
            "heartbeat": {
                "agent_version": "synthetic",
                "uptime_s": round(time.time() - self.started, 1),
                "spool_depth": 0,
                "gpus": [
                    {
                        "index": g,
                        "uuid": f"GPU-{self.index:04x}{g:04x}-0000-0000-0000-000000000000",
                        # as the Xid lines name it, so a kernel line finds its GPU
                        "pci_bus_id": f"00000000:{pci_bus(g):02X}:00.0",
                        "model": "H100",
                    }
                    for g in range(self.gpus)
                ]
                if self.batches == 1
                else [],
            },
            "metrics": metrics,
            "logs": logs,
            "processes": self.processes(now) if with_processes else [],
        }


def make_nodes(count: int, *, gpus: int, job_id: str, prefix: str = "sim-node") -> list[SyntheticNode]:
    return [
        SyntheticNode(f"{prefix}-{i:04d}", index=i, gpus=gpus, job_id=job_id, world_size=count * gpus)
        for i in range(count)
    ]


def run_traffic(server: str, token: str, *, nodes: int, gpus: int, interval: float, job_id: str = "demo-job") -> None:
    """Post one batch per node per interval until interrupted; survive the service restarting."""
    cluster = make_nodes(nodes, gpus=gpus, job_id=job_id)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=server, headers=headers, timeout=10) as client:
        while True:
            started = time.monotonic()
            for node in cluster:
                try:
                    response = client.post("/api/v1/ingest", content=orjson.dumps(node.batch(interval=interval)))
                    if response.status_code >= 400:
                        log.warning("ingest answered %s: %s", response.status_code, response.text[:200])
                except httpx.HTTPError as exc:
                    log.warning("ingest failed: %s", exc)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
