"""The job a GPU sample belongs to when neither its batch nor a training process on its node names one.

Nodes that run only dcgm-exporter (an agent without `hostPID`, ranks in containers, metrics only) still belong
to a job. In this order of trust, after the batch's own job and the node's training processes:
1. dcgm-exporter's labels on the GPU's series: Kubernetes `namespace`/`pod` (a job declares its pods' namespace
   and name prefix) or the HPC job id `hpc_job` (a job declares the scheduler's id, or is registered under it);
2. the rank map a scheduler registered: a node named in a running job's map is that job's from the registration
   until the job ends, the node leaves service (cordoned, evicted, in repair) after it was placed, or a newer
   registration names it. By GPU where the map says which GPU a rank uses (two jobs on one node), else by node.
Where two running jobs claim the same GPU (or node), the newer registration wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from service.ingest.schemas import IngestBatch, Workload
from service.nodes.lifecycle import OUT_OF_SERVICE  # a node leaving service after its placement leaves the map

_RANK_MAP_SQL = """
SELECT DISTINCT ON (n.name, r.gpu_index) n.name, r.gpu_index, j.id, j.updated_at
FROM nodes n
JOIN ranks r ON r.node_id = n.id
JOIN jobs j ON j.id = r.job_id
WHERE n.name = ANY(%(nodes)s) AND j.state = 'running' AND j.source = 'registered'
  AND n.state <> ALL(%(left)s)
  AND NOT EXISTS (SELECT 1 FROM node_events e WHERE e.node_id = n.id AND e.to_state = ANY(%(left)s)
                  AND e.at > r.updated_at)
ORDER BY n.name, r.gpu_index, j.updated_at DESC, j.id DESC
"""

_WORKLOAD_SQL = """
SELECT id, external_id, scheduler_job_id, pods_namespace, pods_prefix
FROM jobs
WHERE state = 'running'
  AND (external_id = ANY(%(hpc)s) OR scheduler_job_id = ANY(%(hpc)s) OR pods_namespace = ANY(%(namespaces)s))
ORDER BY updated_at DESC, id DESC
"""


def workload_key(workload: Workload | None) -> tuple[str, str, str] | None:
    """(namespace, pod, hpc_job) of a labelled GPU; None when the exporter named no workload."""
    if workload is None or not (workload.hpc_job or (workload.namespace and workload.pod)):
        return None
    return (workload.namespace or "", workload.pod or "", workload.hpc_job or "")


@dataclass
class Attribution:
    """Jobs by exporter label and by registered rank map, for the nodes of one flush."""

    by_workload: dict[tuple[str, str, str], int] = field(default_factory=dict)
    by_gpu: dict[tuple[str, int], int] = field(default_factory=dict)
    by_node: dict[str, int] = field(default_factory=dict)
    nodes: frozenset[str] = frozenset()  # the nodes looked up

    def job_of(self, node: str, *, gpu: int | None = None, workload: Workload | None = None) -> int | None:
        key = workload_key(workload)
        if key is not None and key in self.by_workload:
            return self.by_workload[key]
        if gpu is not None and (node, gpu) in self.by_gpu:
            return self.by_gpu[(node, gpu)]
        return self.by_node.get(node)

    def jobs(self) -> set[int]:
        return {*self.by_workload.values(), *self.by_gpu.values(), *self.by_node.values()}


def lookup(conn: psycopg.Connection[Any], batches: Iterable[IngestBatch], *, unnamed: set[str]) -> Attribution:
    """What the labels and rank maps say about the nodes in `unnamed` (batches naming no job, no process)."""
    found = Attribution(nodes=frozenset(unnamed))
    if not unnamed:
        return found
    keys = {
        key
        for batch in batches
        if batch.node in unnamed
        for sample in batch.metrics
        if not sample.job_id and (key := workload_key(sample.workload)) is not None
    }
    with conn.cursor() as cur:
        if keys:
            cur.execute(
                _WORKLOAD_SQL,
                {"hpc": sorted({k[2] for k in keys if k[2]}), "namespaces": sorted({k[0] for k in keys if k[0]})},
            )
            jobs = cur.fetchall()
            for key in keys:
                job = next((j[0] for j in jobs if _matches(key, *j[1:])), None)  # newest registration first
                if job is not None:
                    found.by_workload[key] = job
        cur.execute(_RANK_MAP_SQL, {"nodes": sorted(unnamed), "left": list(OUT_OF_SERVICE)})
        newest: dict[str, tuple[Any, int]] = {}
        for node, gpu, job, registered in cur.fetchall():
            if gpu is not None:
                found.by_gpu[(node, gpu)] = job
            if node not in newest or (registered, job) > newest[node]:
                newest[node] = (registered, job)
        found.by_node = {node: job for node, (_, job) in newest.items()}
    return found


def _matches(
    key: tuple[str, str, str], external_id: str, scheduler_job_id: str | None, namespace: str | None, prefix: str | None
) -> bool:
    pods_namespace, pod, hpc_job = key
    if hpc_job and hpc_job in (external_id, scheduler_job_id):
        return True
    return bool(namespace and prefix and pods_namespace == namespace and pod.startswith(prefix))
