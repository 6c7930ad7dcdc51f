"""Agent-shaped batches from a synthetic synchronous training job: demo traffic and benchmark load.

Counters are correlated the way they are on a busy GPU (utilization drives power, temperature and
clocks) with per-GPU noise. This is load, not a fault simulator.
"""

from __future__ import annotations

import logging
import math
import random
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

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
PROCESS_EVERY = 5


class SyntheticNode:
    """One node of the job: its GPUs' counters advance with every batch."""

    def __init__(self, name: str, *, index: int, gpus: int, job_id: str, world_size: int, seed: int = 0) -> None:
        self.name = name
        self.index = index
        self.gpus = gpus
        self.job_id = job_id
        self.world_size = world_size
        self.rng = random.Random(seed * 7919 + index)
        self.energy = [self.rng.uniform(1e9, 2e9) for _ in range(gpus)]
        self.bytes = [0.0] * gpus
        self.step = 0
        self.started = time.time()

    def batch(self, now: datetime | None = None, *, interval: float = 1.0) -> dict[str, Any]:
        now = now or datetime.now(UTC)
        ts = now.isoformat()
        phase = math.sin(now.timestamp() / 7.0)  # the whole job breathes together
        metrics = []
        for gpu in range(self.gpus):
            util = min(100.0, max(0.0, 92 + 5 * phase + self.rng.gauss(0, 1.5)))
            power = 300 + 3.5 * util + self.rng.gauss(0, 6)
            self.energy[gpu] += power * interval * 1000
            self.bytes[gpu] += util * 2.5e8 * interval
            values = {
                "DCGM_FI_DEV_GPU_UTIL": round(util),
                "DCGM_FI_DEV_MEM_COPY_UTIL": round(util * 0.45 + self.rng.gauss(0, 2)),
                "DCGM_FI_DEV_SM_CLOCK": 1980 - round(self.rng.random() * 15),
                "DCGM_FI_DEV_MEM_CLOCK": 2619,
                "DCGM_FI_DEV_GPU_TEMP": round(45 + util * 0.25 + self.rng.gauss(0, 0.7)),
                "DCGM_FI_DEV_MEMORY_TEMP": round(50 + util * 0.2 + self.rng.gauss(0, 0.7)),
                "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
                "DCGM_FI_DEV_FB_FREE": 12_000 + gpu,
                "DCGM_FI_DEV_FB_USED": 69_000 - gpu,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100 * 0.98, 4),
                "DCGM_FI_PROF_SM_ACTIVE": round(util / 100 * 0.9, 4),
                "DCGM_FI_PROF_SM_OCCUPANCY": round(util / 100 * 0.55, 4),
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(util / 100 * 0.6 + self.rng.gauss(0, 0.01), 4),
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
            metrics.append({"ts": ts, "gpu": gpu, "fields": values})
        self.step += 1
        # Like the agent, snapshot processes every PROCESS_EVERY batches: they change slowly, and at
        # one per GPU per second they would double the rows ingest writes.
        processes = (
            []
            if (self.step - 1) % PROCESS_EVERY
            else [
                {
                    "ts": ts,
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
        )
        logs = []
        if self.index == 0:
            logs.append(
                {
                    "ts": ts,
                    "source": "training",
                    "kind": "step",
                    "severity": "info",
                    "rank": 0,
                    "line": f" iteration {self.step:8d}/ 100000 | elapsed time per iteration (ms): "
                    f"{1000 * interval:.1f} | lm loss: {3.2 / (1 + self.step / 5000):.6E} |",
                    "fields": {"step": self.step},
                }
            )
        return {
            "batch_id": str(uuid.uuid4()),
            "node": self.name,
            "sent_at": ts,
            "job_id": self.job_id,
            "heartbeat": {
                "agent_version": "synthetic",
                "uptime_s": round(time.time() - self.started, 1),
                "spool_depth": 0,
                "gpus": [
                    {"index": g, "uuid": f"GPU-{self.index:04x}{g:04x}-0000-0000-0000-000000000000", "model": "H100"}
                    for g in range(self.gpus)
                ]
                if self.step == 1
                else [],
            },
            "metrics": metrics,
            "logs": logs,
            "processes": processes,
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
