"""The NVLink fabric the heartbeats report: each GPU's fabric info onto its `gpus` row, and the node's NVLink domain,
clique and fabric manager state onto its labels (`nvlink_domain`, `nvlink_clique`, `fabric_manager`), where
schedulers and the domain check (service/nvlink/) read them.

Only a heartbeat that carries the GPU inventory (every process scan) says anything here; a node whose inventory
has no fabric info loses its domain labels (it left the fabric, or never was in one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
import psycopg

from service.ingest.schemas import GpuFabric, IngestBatch

FABRIC_LABELS = ("nvlink_domain", "nvlink_clique", "fabric_manager")
_NO_FABRIC: tuple[Any, ...] = (None,) * 7


class Cache(Protocol):
    def needs_write(self, key: tuple[Any, ...], value: tuple[Any, ...], *, partial: bool = False) -> bool: ...

    def stage(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None: ...


def _row(fabric: GpuFabric | None) -> tuple[Any, ...]:
    if fabric is None:
        return _NO_FABRIC
    return (
        fabric.cluster_uuid,
        fabric.clique_id,
        fabric.state,
        fabric.status,
        fabric.health,
        fabric.degraded_bw,
        fabric.gfm,
    )


def node_labels(batch: IngestBatch) -> dict[str, Any] | None:
    """The node's fabric labels from its heartbeat (None: the heartbeat says nothing about them)."""
    hb = batch.heartbeat
    if hb is None or (not hb.gpus and hb.host is None):
        return None
    labels: dict[str, Any] = {}
    if hb.gpus:
        # A tray's GPUs share one domain and clique; a GPU still registering names none: the most common wins.
        domains = Counter(g.fabric.cluster_uuid for g in hb.gpus if g.fabric and g.fabric.cluster_uuid)
        if domains:
            domain = domains.most_common(1)[0][0]
            labels["nvlink_domain"] = domain
            cliques = Counter(
                g.fabric.clique_id
                for g in hb.gpus
                if g.fabric and g.fabric.cluster_uuid == domain and g.fabric.clique_id is not None
            )
            if cliques:
                labels["nvlink_clique"] = str(cliques.most_common(1)[0][0])
    if hb.host is not None and hb.host.fabric_manager:
        labels["fabric_manager"] = hb.host.fabric_manager
    return labels


def record(conn: psycopg.Connection[Any], batches: list[IngestBatch], nodes: Mapping[str, int], cache: Cache) -> None:
    """Write the batches' fabric facts that changed (the GPU rows exist: `_upsert_gpus` ran first), in key order."""
    gpus: dict[tuple[int, int], tuple[Any, ...]] = {}
    labels: dict[int, tuple[dict[str, Any], bool, bool]] = {}
    for batch in batches:
        hb = batch.heartbeat
        if hb is None:
            continue
        node = nodes[batch.node]
        for gpu in hb.gpus:
            gpus[(node, gpu.index)] = _row(gpu.fabric)
        found = node_labels(batch)
        if found is not None:
            labels[node] = (found, bool(hb.gpus), hb.host is not None)
    changed = sorted(k for k, v in gpus.items() if cache.needs_write(("fabric", *k), v))
    with conn.cursor() as cur:
        if changed:
            cur.execute(
                """
                UPDATE gpus SET fabric_cluster_uuid = t.u, fabric_clique_id = t.c, fabric_state = t.s,
                    fabric_status = t.st, fabric_health = t.h, fabric_degraded_bw = t.bw, fabric_gfm = t.g,
                    fabric_at = CASE WHEN t.s IS NULL THEN NULL ELSE now() END
                FROM unnest(%s::bigint[], %s::smallint[], %s::text[], %s::bigint[], %s::text[], %s::int[],
                            %s::text[], %s::bool[], %s::text[]) AS t(n, i, u, c, s, st, h, bw, g)
                WHERE gpus.node_id = t.n AND gpus.index = t.i
                """,
                (
                    [k[0] for k in changed],
                    [k[1] for k in changed],
                    *([gpus[k][i] for k in changed] for i in range(7)),
                ),
            )
        for node in sorted(labels):
            found, says_domain, says_manager = labels[node]
            # Keys the heartbeat speaks for are replaced (absent: removed); the others (rack, switch...) stay.
            owned = [k for k, says in (("nvlink_domain", says_domain), ("nvlink_clique", says_domain),
                                       ("fabric_manager", says_manager)) if says]  # fmt: skip
            value = tuple(sorted(found.items())) + tuple(owned)
            if not cache.needs_write(("fabric_labels", node), value):
                continue
            cur.execute(
                """
                UPDATE nodes SET labels = (COALESCE(labels, '{}'::jsonb) - %s::text[]) || %s::jsonb
                WHERE id = %s AND (COALESCE(labels, '{}'::jsonb) - %s::text[]) || %s::jsonb
                                  IS DISTINCT FROM labels
                """,
                (owned, orjson.dumps(found).decode(), node, owned, orjson.dumps(found).decode()),
            )
            cache.stage(("fabric_labels", node), value)
    for k in changed:
        cache.stage(("fabric", *k), gpus[k])
