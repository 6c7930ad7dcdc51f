"""The yardstick for ingest: psycopg COPY of the same metric rows into the same table, no HTTP, no API.

Rows are built by the server's own `metric_rows` from the same synthetic batches and written in
transactions the size of a full server flush. They carry a job id no real job
has (negative), so they can be deleted afterwards.
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from lab.bench.synthetic import make_nodes
from service.ingest.schemas import IngestBatch
from service.ingest.service import copy_rows, metric_rows
from service.models import METRIC_COPY_TYPES, METRIC_SAMPLE_COLUMNS


@dataclass(frozen=True)
class CopyResult:
    rows: int
    seconds: float
    rows_per_transaction: int
    delete_seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    def figures(self) -> dict[str, Any]:
        return asdict(self) | {"rows_per_s": self.rows_per_s}


def _rows_by_node(
    node_ids: dict[str, int], *, gpus: int, job_id: int, job_name: str, prefix: str
) -> list[list[list[Any]]]:
    cluster = make_nodes(len(node_ids), gpus=gpus, job_id=job_name, prefix=prefix)
    return [
        list(metric_rows(IngestBatch.model_validate(node.batch()), node_id=node_ids[node.name], job_id=job_id, jobs={}))
        for node in cluster
    ]


def run_copy(
    dsn: str,
    *,
    node_ids: dict[str, int],
    gpus: int,
    job_name: str,
    prefix: str,
    rows: int,
    batches_per_transaction: int,
) -> CopyResult:
    """COPY at least `rows` rows, one node batch after another, with the server's own statement
    (binary COPY), then delete them."""
    tag = -secrets.randbelow(2**62) - 1
    per_node = _rows_by_node(node_ids, gpus=gpus, job_id=tag, job_name=job_name, prefix=prefix)
    written = 0
    batches = itertools.cycle(per_node)
    with psycopg.connect(dsn) as conn:
        try:
            started = time.perf_counter()
            while written < rows:
                chunk: list[list[Any]] = []
                for _ in range(batches_per_transaction):
                    batch_rows = next(batches)
                    ts = datetime.now(UTC)  # one instant per batch, as an agent stamps it
                    for row in batch_rows:
                        row[0] = ts
                    chunk.extend(batch_rows)
                with conn.transaction():
                    copy_rows(conn, "metric_samples", METRIC_SAMPLE_COLUMNS, METRIC_COPY_TYPES, chunk)
                written += len(chunk)
            seconds = time.perf_counter() - started
        finally:
            deleting = time.perf_counter()
            with conn.transaction():
                conn.execute("DELETE FROM metric_samples WHERE job_id = %s", (tag,))
            delete_seconds = time.perf_counter() - deleting
    return CopyResult(
        rows=written,
        seconds=seconds,
        rows_per_transaction=batches_per_transaction * gpus,
        delete_seconds=delete_seconds,
    )
