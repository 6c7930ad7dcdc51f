"""What an NVL72 rack's tray agents send: the simulated cluster's state read by the agent's own code.

Each compute tray's batch is built as its agent builds one: its GPUs read through the agent's NVML reader
(agents/nvml.py, agents/nvml_fabric.py) from the tray's fake NVML (the rack's fabric state, lab/sim/nvl72.py), its
kernel lines through the agent's kernel log parser, its ranks as the agent's process snapshots, and its heartbeat
with the GPU inventory (fabric info included) and the host facts. The batches are the ingest wire format
(docs/wire.md); a harness posts them to a service (`POST /api/v1/ingest`).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

from agents.nvml import Nvml
from agents.parsers.kernel import KernelLogParser
from lab.sim.model import Cluster, LogLine

AGENT_VERSION = "sim-nvl72"
DRIVER = "570.133.20"
KERNEL = "6.8.0-1017-nvidia-64k"


class TrayAgents:
    """The agents of the cluster's trays: one kernel log parser each, kept across rounds as a running agent's."""

    def __init__(self, cluster: Cluster) -> None:
        if cluster.nvl72 is None:
            raise ValueError("not an NVL72 cluster (SimConfig.nvl72)")
        self.cluster = cluster
        self.parsers = {n: KernelLogParser() for n in range(cluster.machines)}

    def batches(self, lines: list[LogLine], *, now: datetime) -> list[dict[str, Any]]:
        """One batch per tray of the job: what its agent ships after `lines` were written (the cluster's output since
        the last round)."""
        cluster, domain = self.cluster, self.cluster.nvl72
        assert domain is not None
        kern: dict[str, list[str]] = defaultdict(list)
        for line in lines:
            if line.stream == "kern":
                kern[line.node].extend(line.text.split("\n"))
        job_id = cluster.config.job_id
        out = []
        for k in range(cluster.config.nodes):
            n = cluster.slots[k]
            name = cluster.node_names[n]
            nvml = domain.fake_nvml(n, [(g.bus, g.uuid) for g in cluster.gpus[n]])
            nvml.nvmlInit()
            reader = Nvml(nvml, len(cluster.gpus[n]))
            readings = reader.read()  # the first read takes the slow readings too: links, counters, fabric
            reader.close()
            parser = self.parsers[n]
            events = [e for raw in kern.get(name, []) for e in parser.feed(raw, now=now)]
            events += parser.flush(now=now)
            ts = now.isoformat()
            ranks = cluster.ranks_on(n)
            out.append(
                {
                    "batch_id": str(uuid.uuid4()),
                    "node": name,
                    "sent_at": ts,
                    "heartbeat": {
                        "agent_version": AGENT_VERSION,
                        "jobs": [job_id],
                        "gpus": [r.inventory() for r in readings],
                        "host": {"driver_version": DRIVER, "kernel": KERNEL, "rdma": True},
                    },
                    "metrics": [{"ts": ts, "gpu": r.gpu, "fields": r.fields} for r in readings],
                    "logs": [e.to_wire() for e in events],
                    "processes": [
                        {
                            "ts": ts,
                            "pid": 10_000 + rank,
                            "job_id": job_id,
                            "rank": rank,
                            "local_rank": local,
                            "world_size": cluster.world,
                            "gpu": local,
                            "cpu_pct": 99.0,
                            "rss_bytes": 1 << 30,
                            "state": "R",
                        }
                        for local, rank in enumerate(ranks)
                    ],
                }
            )
        return out
