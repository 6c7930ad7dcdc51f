"""The node's place and versions from its heartbeat's host facts onto its labels: `rack`, `switch`, `power_domain`,
`driver_version`, `firmware_version`, `kernel_version`, `storage_mounts`. Shared-cause detection
(service/shared_causes/, ml/shared_causes.py) groups failing nodes by them.

Only a heartbeat with host facts (every process scan) says anything here: the keys it speaks for are replaced (a fact
it no longer reports is removed), the node's other labels (the NVLink domain, an operator's own) stay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import psycopg

from service.ingest.fabric import Cache
from service.ingest.schemas import HostFacts, IngestBatch

# Label key -> the HostFacts field it is read from.
INVENTORY_LABELS = {
    "rack": "rack",
    "switch": "switch",
    "power_domain": "power_domain",
    "driver_version": "driver_version",
    "firmware_version": "firmware_version",
    "kernel_version": "kernel",
    "storage_mounts": "storage_mounts",
}


def node_labels(host: HostFacts) -> dict[str, Any]:
    """The labels these host facts give (absent or empty facts give none)."""
    labels: dict[str, Any] = {}
    for key, attr in INVENTORY_LABELS.items():
        value = getattr(host, attr)
        if isinstance(value, list):
            value = sorted(set(value))
        if value:
            labels[key] = value
    return labels


def record(conn: psycopg.Connection[Any], batches: list[IngestBatch], nodes: Mapping[str, int], cache: Cache) -> None:
    """Write the labels that changed, in node order (the lock order of the ingest's other writes)."""
    found: dict[int, dict[str, Any]] = {}
    for batch in batches:
        hb = batch.heartbeat
        if hb is not None and hb.host is not None:
            found[nodes[batch.node]] = node_labels(hb.host)  # the batch's last heartbeat wins
    owned = list(INVENTORY_LABELS)
    with conn.cursor() as cur:
        for node in sorted(found):
            labels = orjson.dumps(found[node]).decode()
            value = tuple(sorted((k, str(v)) for k, v in found[node].items()))
            if not cache.needs_write(("inventory_labels", node), value):
                continue
            cur.execute(
                """
                UPDATE nodes SET labels = (COALESCE(labels, '{}'::jsonb) - %s::text[]) || %s::jsonb
                WHERE id = %s AND (COALESCE(labels, '{}'::jsonb) - %s::text[]) || %s::jsonb IS DISTINCT FROM labels
                """,
                (owned, labels, node, owned, labels),
            )
            cache.stage(("inventory_labels", node), value)
