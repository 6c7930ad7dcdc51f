"""Agent-shaped payloads for tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any


def batch(
    node: str = "gpu-node-001", *, gpus: int = 2, job_id: str | None = "job-1", **overrides: Any
) -> dict[str, Any]:
    ts = datetime.now(UTC).isoformat()
    payload: dict[str, Any] = {
        "batch_id": str(uuid.uuid4()),
        "node": node,
        "sent_at": ts,
        "heartbeat": {
            "agent_version": "0.1.0",
            "uptime_s": 12.5,
            "gpus": [{"index": g, "uuid": f"GPU-{g:08x}", "model": "NVIDIA H100 80GB HBM3"} for g in range(gpus)],
        },
        "metrics": [
            {
                "ts": ts,
                "gpu": g,
                "fields": {
                    "DCGM_FI_DEV_GPU_UTIL": 97,
                    "DCGM_FI_DEV_POWER_USAGE": 650.5,
                    "DCGM_FI_DEV_SM_CLOCK": 1980,
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789012,
                },
            }
            for g in range(gpus)
        ],
        "logs": [
            {
                "ts": ts,
                "source": "kmsg",
                "kind": "xid",
                "severity": "critical",
                "line": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
                "fields": {"xid": 79, "pci": "0000:3b:00"},
            }
        ],
        "stacks": [],
        "processes": [
            {
                "ts": ts,
                "pid": 4000 + g,
                "job_id": job_id,
                "rank": g,
                "local_rank": g,
                "world_size": gpus,
                "cpu_pct": 99.0,
                "rss_bytes": 1 << 30,
                "state": "R",
            }
            for g in range(gpus)
        ]
        if job_id
        else [],
    }
    payload.update(overrides)
    return payload
