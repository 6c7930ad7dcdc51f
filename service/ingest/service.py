"""Store agent batches with set-based statements and COPY: a flush of many batches is a few round trips.

Locks are taken in one global order (jobs, then nodes, then ranks and GPUs, each sorted by key),
so concurrent flushes from several API processes cannot deadlock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.orm import Session

from ml.metrics import FIELD_TO_COLUMN
from service.checks import loop as checks_loop
from service.config import get_settings
from service.ingest import attribution, fabric, inventory
from service.ingest.attribution import Attribution
from service.ingest.schemas import IngestBatch, MetricSample, Workload
from service.models import METRIC_COPY_TYPES, METRIC_SAMPLE_COLUMNS, NODE_COPY_TYPES, NODE_SAMPLE_COLUMNS
from service.nodes import returns as node_returns
from service.nodes.lifecycle import OUT_OF_SERVICE
from service.unknown_lines import record as unknown_lines

log = logging.getLogger(__name__)

# dcgm-exporter reports unsupported fields as values near INT64_MAX; they mean "no value".
DCGM_BLANK_THRESHOLD = 9.0e18
_METRIC_INDEX = {name: i for i, name in enumerate(METRIC_SAMPLE_COLUMNS)}
_EXTRA_INDEX = _METRIC_INDEX["extra"]
# DCGM field name -> position in a metric_samples row: one lookup per value on the hottest loop.
_FIELD_INDEX = {field: _METRIC_INDEX[column] for field, column in FIELD_TO_COLUMN.items()}
# node_metrics field name -> position in a node_samples row (names the service does not know are dropped).
_NODE_INDEX = {name: i for i, name in enumerate(NODE_SAMPLE_COLUMNS) if i >= 4}
# A batch field -> the column job_columns records for it, by source (node fields are named as their columns).
_REPORTED_COLUMN: dict[str, dict[str, str]] = {"gpu": FIELD_TO_COLUMN, "node": {name: name for name in _NODE_INDEX}}


@dataclass
class _Keys:
    """Database ids for the names a flush mentions."""

    nodes: dict[str, int]
    jobs: dict[str, int]
    # node name -> the job it runs now, for items that name no job
    current_job: dict[str, int]
    # exporter labels and registered rank maps, for nodes whose batches name no job
    attributed: Attribution = field(default_factory=Attribution)

    def job_of(
        self, batch: IngestBatch, item_job: str | None, *, gpu: int | None = None, workload: Workload | None = None
    ) -> int | None:
        name = item_job or _batch_job(batch)
        if name:
            return self.jobs.get(name)
        found = self.attributed.job_of(batch.node, gpu=gpu, workload=workload)
        return found if found is not None else self.current_job.get(batch.node)


@dataclass
class UpsertCache:
    """Rows this process last wrote for slowly-changing facts (rank placement, GPU inventory).

    Agents repeat them in every batch; writing them again would double the database work of ingest.
    Entries expire after `ttl`, so a value another API process wrote meanwhile is rewritten soon, and
    they are staged until the transaction commits, so a rolled-back write is not remembered.
    """

    ttl: float = 60.0
    max_entries: int = 500_000
    _seen: dict[tuple[Any, ...], tuple[tuple[Any, ...], float]] = field(default_factory=dict)
    _staged: dict[tuple[Any, ...], tuple[tuple[Any, ...], float]] = field(default_factory=dict)

    def needs_write(self, key: tuple[Any, ...], value: tuple[Any, ...], *, partial: bool = False) -> bool:
        """Whether `value` must be written; `partial` values (only filling gaps) skip any known key."""
        hit = self._seen.get(key)
        if hit is None or time.monotonic() - hit[1] > self.ttl:
            return True
        return not partial and hit[0] != value

    def stage(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self._staged[key] = (value, time.monotonic())

    def commit(self) -> None:
        if len(self._seen) + len(self._staged) > self.max_entries:
            self._seen.clear()
        self._seen.update(self._staged)
        self._staged.clear()

    def rollback(self) -> None:
        self._staged.clear()


@dataclass
class BatchOutcome:
    batch_id: str
    duplicate: bool
    stored: dict[str, int] = field(default_factory=dict)


def raw_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under the session's transaction, for COPY."""
    return session.connection().connection.driver_connection  # type: ignore[return-value]


def store_batches(session: Session, *, batches: list[IngestBatch], cache: UpsertCache) -> list[BatchOutcome]:
    """Write batches in one transaction; batches already stored (same batch id) are skipped.

    The caller commits, then calls `cache.commit()` (or `cache.rollback()` if the commit failed).
    """
    conn = raw_connection(session)
    job_ids = _ensure_jobs(conn, batches)
    attributed = attribution.lookup(conn, batches, unnamed={b.node for b in batches if not _batch_job(b)})
    _seen_jobs(conn, attributed.jobs())
    node_ids, current_job, held_out = _upsert_nodes(conn, batches, job_ids, attributed)
    keys = _Keys(node_ids, job_ids, current_job, attributed)
    new_ids = _claim_batches(conn, batches, node_ids)
    outcomes: list[BatchOutcome] = []
    fresh: list[IngestBatch] = []
    for batch in batches:
        key = str(batch.batch_id)
        if key in new_ids:
            new_ids.discard(key)  # a batch id twice in one flush: the second is a duplicate
            fresh.append(batch)
            outcomes.append(BatchOutcome(key, False, _counts(batch)))
        else:
            outcomes.append(BatchOutcome(key, True, {}))
    if fresh:
        _copy_metrics(conn, fresh, keys)
        _copy_node_metrics(conn, fresh, keys)
        _copy_logs(conn, fresh, keys)
        _copy_stacks(conn, fresh, keys)
        _copy_processes(conn, fresh, keys)
        _upsert_ranks(conn, fresh, keys, cache)
        _upsert_gpus(conn, fresh, keys, cache)
        fabric.record(conn, fresh, keys.nodes, cache)  # after the GPU rows it updates
        inventory.record(conn, fresh, keys.nodes, cache)  # the node's place and versions as labels
        _record_columns(conn, fresh, keys, cache)  # in key order: the lock order above holds
        _record_unknown_lines(conn, fresh, keys)  # last, in key order too
        _record_checks(session, fresh, keys)
        _placements(session, fresh, keys, held_out)
    return outcomes


def _record_unknown_lines(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys) -> None:
    """Error-looking lines no rule knows, counted per form for the whole flush (service/unknown_lines/): a new
    driver's or library's message is noticed, not dropped."""
    lines = [
        unknown_lines.Seen(e.source, e.line, e.ts, keys.nodes[b.node], keys.job_of(b, e.job_id), b.node)
        for b in batches
        for e in b.logs
        if unknown_lines.is_unknown(e)
    ]
    if lines:
        unknown_lines.record(conn, lines)


def _placements(session: Session, batches: list[IngestBatch], keys: _Keys, held_out: set[str]) -> None:
    """Nodes faultline holds out of service whose agents report ranks of a job (rare: a few batches after an
    eviction, then only when a scheduler puts work there): new work is placed before their gate
    (service/nodes/returns.py)."""
    reports: dict[int, tuple[int, str, list[tuple[int, datetime]]]] = {}
    for b in batches:
        if b.node not in held_out:
            continue
        for proc in b.processes:
            name = proc.job_id or _batch_job(b)
            job = keys.jobs.get(name) if name else None
            if job is None or proc.rank is None:
                continue
            _, _, seen = reports.setdefault(keys.nodes[b.node], (job, name or "", []))
            seen.append((proc.pid, proc.ts))
    if reports:
        node_returns.placed_by_agents(session, reports=reports, now=datetime.now(UTC))


def _record_checks(session: Session, batches: list[IngestBatch], keys: _Keys) -> None:
    """Stop-time check results (rare: one batch per suite), judged against the fleet and stored; those answering
    a diagnose decision are acted on (service/checks/loop.py)."""
    for b in batches:
        if b.checks:
            checks_loop.accept(
                session,
                node_id=keys.nodes[b.node],
                node=b.node,
                batch_id=b.batch_id,
                items=b.checks,
                now=datetime.now(UTC),
                settings=get_settings(),
            )


def _counts(batch: IngestBatch) -> dict[str, int]:
    return {
        "metrics": len(batch.metrics),
        "node_metrics": len(batch.node_metrics),
        "logs": len(batch.logs),
        "stacks": len(batch.stacks),
        "processes": len(batch.processes),
    }


def _batch_job(batch: IngestBatch) -> str | None:
    """The job a node is running: named by the batch, else by its training processes."""
    if batch.job_id:
        return batch.job_id
    jobs = {p.job_id for p in batch.processes if p.job_id}
    return jobs.pop() if len(jobs) == 1 else None


def _ensure_jobs(conn: psycopg.Connection[Any], batches: list[IngestBatch]) -> dict[str, int]:
    """Create jobs agents report that nobody registered; return external id -> id."""
    world_sizes: dict[str, int | None] = {}
    for batch in batches:
        for name in (
            batch.job_id,
            *(i.job_id for i in (*batch.metrics, *batch.node_metrics, *batch.logs, *batch.stacks)),
        ):
            if name:
                world_sizes.setdefault(name, None)
        for proc in batch.processes:
            if proc.job_id:
                world_sizes[proc.job_id] = proc.world_size or world_sizes.get(proc.job_id)
    if not world_sizes:
        return {}
    names = sorted(world_sizes)
    with conn.cursor() as cur:
        # Plain reads first: existing jobs are the common case and take no row lock.
        cur.execute("SELECT external_id, id FROM jobs WHERE external_id = ANY(%s)", (names,))
        ids = dict(cur.fetchall())
        missing = [n for n in names if n not in ids]
        if missing:
            cur.execute(
                """
                INSERT INTO jobs (external_id, world_size, source, last_seen_at)
                SELECT n, w, 'agent', now() FROM unnest(%s::text[], %s::int[]) AS t(n, w)
                ON CONFLICT (external_id) DO NOTHING
                """,
                (missing, [world_sizes[n] for n in missing]),
            )
            cur.execute("SELECT external_id, id FROM jobs WHERE external_id = ANY(%s)", (missing,))
            ids.update(cur.fetchall())
        # Throttled so that thousands of nodes reporting one job do not queue on its row lock.
        cur.execute(
            """
            UPDATE jobs SET last_seen_at = now(),
                world_size = COALESCE(jobs.world_size, t.w)
            FROM unnest(%s::bigint[], %s::int[]) AS t(id, w)
            WHERE jobs.id = t.id
              AND (jobs.last_seen_at IS NULL OR jobs.last_seen_at < now() - interval '10 seconds'
                   OR (jobs.world_size IS NULL AND t.w IS NOT NULL))
            """,
            ([ids[n] for n in names], [world_sizes[n] for n in names]),
        )
    return ids


def _seen_jobs(conn: psycopg.Connection[Any], job_ids: set[int]) -> None:
    """Jobs known only through exporter labels or rank maps are seen too (throttled as in _ensure_jobs)."""
    if not job_ids:
        return
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE jobs SET last_seen_at = now() WHERE id = ANY(%s) "
            "AND (last_seen_at IS NULL OR last_seen_at < now() - interval '10 seconds')",
            (sorted(job_ids),),
        )


def _upsert_nodes(
    conn: psycopg.Connection[Any], batches: list[IngestBatch], job_ids: dict[str, int], attributed: Attribution
) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """name -> id of every node, name -> the job it runs, and the names of those out of service."""
    latest: dict[str, IngestBatch] = {}
    for batch in batches:
        seen = latest.get(batch.node)
        if seen is None or batch.sent_at >= seen.sent_at:
            latest[batch.node] = batch
    names = sorted(latest)
    jobs = [job_ids.get(_batch_job(latest[n]) or "") or attributed.by_node.get(n) for n in names]
    versions = [latest[n].heartbeat.agent_version if latest[n].heartbeat else None for n in names]
    with conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO nodes (name, last_seen_at, agent_version, current_job_id)
            SELECT n, now(), v, j FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS t(n, v, j)
            ON CONFLICT (name) DO UPDATE SET
                last_seen_at = excluded.last_seen_at,
                agent_version = COALESCE(excluded.agent_version, nodes.agent_version),
                -- Out of service it runs no job, whatever its dying processes said a moment ago (the demo's
                -- evicted node kept the job through its repair and its dead GPU's counters accused it again).
                current_job_id = CASE WHEN nodes.state = ANY(%s::text[]) THEN NULL
                                      ELSE COALESCE(excluded.current_job_id, nodes.current_job_id) END
            RETURNING name, id, current_job_id, state = ANY(%s::text[])
            """,
            (names, versions, jobs, list(OUT_OF_SERVICE), list(OUT_OF_SERVICE)),
        )
        rows = cur.fetchall()
    nodes = {name: node_id for name, node_id, _, _ in rows}
    held_out = {name for name, _, _, out in rows if out}
    return nodes, {name: current for name, _, current, _ in rows if current is not None}, held_out


def _claim_batches(conn: psycopg.Connection[Any], batches: list[IngestBatch], node_ids: dict[str, int]) -> set[str]:
    """Insert the batch ids; the ones that were not there yet are the batches to store."""
    with conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO agent_batches
                (batch_id, node_id, sent_at, n_metrics, n_logs, n_stacks, n_processes, heartbeat)
            SELECT b::uuid, n, s, m, l, k, p, h::jsonb
            FROM unnest(%s::text[], %s::bigint[], %s::timestamptz[], %s::int[], %s::int[], %s::int[], %s::int[],
                        %s::text[]) AS t(b, n, s, m, l, k, p, h)
            ON CONFLICT (batch_id) DO NOTHING
            RETURNING batch_id
            """,
            (
                [str(b.batch_id) for b in batches],
                [node_ids[b.node] for b in batches],
                [b.sent_at for b in batches],
                [len(b.metrics) for b in batches],
                [len(b.logs) for b in batches],
                [len(b.stacks) for b in batches],
                [len(b.processes) for b in batches],
                [b.heartbeat.model_dump_json() if b.heartbeat else None for b in batches],
            ),
        )
        return {str(row[0]) for row in cur.fetchall()}


def metric_rows(
    batch: IngestBatch,
    *,
    node_id: int,
    job_id: int | None,
    jobs: dict[str, int],
    job_of_gpu: Callable[[MetricSample], int | None] | None = None,
) -> Iterator[list[Any]]:
    """metric_samples rows of one batch: DCGM fields into their columns, other fields into `extra`. A sample that
    names no job is `job_id`'s, or (`job_of_gpu`) the job its GPU's labels or the rank maps say."""
    width = len(METRIC_SAMPLE_COLUMNS)
    for sample in batch.metrics:
        row: list[Any] = [None] * width
        row[0] = sample.ts
        row[1] = node_id
        row[2] = sample.gpu
        if sample.job_id:
            row[3] = jobs.get(sample.job_id)
        else:
            row[3] = job_of_gpu(sample) if job_of_gpu is not None else job_id
        extra: dict[str, float | None] | None = None
        for name, value in sample.fields.items():
            if value is not None and not -DCGM_BLANK_THRESHOLD < value < DCGM_BLANK_THRESHOLD:
                value = None
            index = _FIELD_INDEX.get(name)
            if index is not None:
                row[index] = value
            else:
                if extra is None:
                    extra = {}
                extra[name] = value
        if extra:
            row[_EXTRA_INDEX] = Jsonb(extra)
        yield row


def copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> None:
    """Binary COPY: several times cheaper per row than text, given each column's PostgreSQL type."""
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def _copy_metrics(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys) -> None:
    rows = (row for batch in batches for row in _batch_metric_rows(batch, keys))
    copy_rows(conn, "metric_samples", METRIC_SAMPLE_COLUMNS, METRIC_COPY_TYPES, rows)


def _batch_metric_rows(batch: IngestBatch, keys: _Keys) -> Iterator[list[Any]]:
    node_id = keys.nodes[batch.node]
    if _batch_job(batch) or batch.node not in keys.attributed.nodes:
        return metric_rows(batch, node_id=node_id, job_id=keys.job_of(batch, None), jobs=keys.jobs)

    def job_of_gpu(sample: MetricSample) -> int | None:
        return keys.job_of(batch, None, gpu=sample.gpu, workload=sample.workload)

    return metric_rows(batch, node_id=node_id, job_id=None, jobs=keys.jobs, job_of_gpu=job_of_gpu)


def node_metric_rows(
    batch: IngestBatch, *, node_id: int, job_id: int | None, jobs: dict[str, int]
) -> Iterator[list[Any]]:
    """node_samples rows of one batch: known fields into their columns."""
    width = len(NODE_SAMPLE_COLUMNS)
    for sample in batch.node_metrics:
        row: list[Any] = [None] * width
        row[0] = sample.ts
        row[1] = node_id
        row[2] = jobs.get(sample.job_id) if sample.job_id else job_id
        row[3] = sample.subject
        for name, value in sample.fields.items():
            index = _NODE_INDEX.get(name)
            if index is not None and value is not None and -DCGM_BLANK_THRESHOLD < value < DCGM_BLANK_THRESHOLD:
                row[index] = value
        yield row


def _copy_node_metrics(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys) -> None:
    rows = [
        row
        for batch in batches
        for row in node_metric_rows(
            batch, node_id=keys.nodes[batch.node], job_id=keys.job_of(batch, None), jobs=keys.jobs
        )
    ]
    if rows:
        copy_rows(conn, "node_samples", NODE_SAMPLE_COLUMNS, NODE_COPY_TYPES, rows)


def _record_columns(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys, cache: UpsertCache) -> None:
    """The metric columns each job's samples carry (job_columns), each written once a cache period: the window
    rollup aggregates only these (service/diagnosis/windows.py)."""
    names: dict[tuple[int, str], set[str]] = {}
    for batch in batches:
        job_id = keys.job_of(batch, None)
        by_gpu = not _batch_job(batch) and batch.node in keys.attributed.nodes
        for sample in batch.metrics:
            if sample.job_id:
                job = keys.jobs.get(sample.job_id)
            else:
                job = keys.job_of(batch, None, gpu=sample.gpu, workload=sample.workload) if by_gpu else job_id
            if job is not None:
                names.setdefault((job, "gpu"), set()).update(sample.fields)
        for sample in batch.node_metrics:
            job = keys.jobs.get(sample.job_id) if sample.job_id else job_id
            if job is not None:
                names.setdefault((job, "node"), set()).update(sample.fields)
    rows = []
    for (job, source), fields in names.items():
        columns = _REPORTED_COLUMN[source]
        for column in {columns[f] for f in fields if f in columns}:
            key = ("column", job, source, column)
            if cache.needs_write(key, (), partial=True):
                cache.stage(key, ())
                rows.append((job, source, column))
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO job_columns (job_id, source, name) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                sorted(rows),
            )


def _json(value: Any) -> Jsonb | None:
    return Jsonb(value) if value is not None else None


_LOG_COLUMNS = (
    "batch_id", "node_id", "job_id", "ts", "source", "path", "kind", "severity", "rank", "line", "fields", "signature"
)  # fmt: skip
_LOG_TYPES = ("uuid", "int8", "int8", "timestamptz", "text", "text", "text", "text", "int4", "text", "jsonb", "text")


def _copy_logs(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys) -> None:
    rows = [
        (b.batch_id, keys.nodes[b.node], keys.job_of(b, e.job_id), e.ts, e.source, e.path, e.kind, e.severity, e.rank,
         e.line, _json(e.fields), e.signature)
        for b in batches
        for e in b.logs
    ]  # fmt: skip
    if rows:
        copy_rows(conn, "log_events", _LOG_COLUMNS, _LOG_TYPES, rows)


_STACK_COLUMNS = ("batch_id", "node_id", "job_id", "ts", "rank", "pid", "directive_id", "threads", "error")
_STACK_TYPES = ("uuid", "int8", "int8", "timestamptz", "int4", "int4", "text", "jsonb", "text")


def _copy_stacks(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys) -> None:
    rows = [
        (b.batch_id, keys.nodes[b.node], keys.job_of(b, d.job_id), d.ts, d.rank, d.pid, d.directive_id,
         _json(d.threads), d.error)
        for b in batches
        for d in b.stacks
    ]  # fmt: skip
    if rows:
        copy_rows(conn, "stack_dumps", _STACK_COLUMNS, _STACK_TYPES, rows)


_PROCESS_COLUMNS = (
    "batch_id", "node_id", "job_id", "ts", "pid", "rank", "local_rank", "cpu_pct", "rss_bytes", "state", "children"
)  # fmt: skip
_PROCESS_TYPES = ("uuid", "int8", "int8", "timestamptz", "int4", "int4", "int4", "float8", "int8", "text", "jsonb")


def _copy_processes(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys) -> None:
    rows = [
        (b.batch_id, keys.nodes[b.node], keys.job_of(b, p.job_id), p.ts, p.pid, p.rank, p.local_rank, p.cpu_pct,
         p.rss_bytes, p.state, _json([c.model_dump(mode="json") for c in p.children] if p.children else None))
        for b in batches
        for p in b.processes
    ]  # fmt: skip
    if rows:
        copy_rows(conn, "process_snapshots", _PROCESS_COLUMNS, _PROCESS_TYPES, rows)


def _upsert_ranks(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys, cache: UpsertCache) -> None:
    """Agents report where each rank runs; the latest report wins."""
    latest: dict[tuple[int, int], tuple[int, int | None, int | None, int]] = {}
    for batch in batches:
        for proc in batch.processes:
            job = keys.jobs.get(proc.job_id) if proc.job_id else None
            if job is None or proc.rank is None:
                continue
            gpu = proc.gpu if proc.gpu is not None else proc.local_rank
            latest[(job, proc.rank)] = (keys.nodes[batch.node], proc.local_rank, gpu, proc.pid)
    changed = sorted(k for k, v in latest.items() if cache.needs_write(("rank", *k), v))
    if not changed:
        return
    with conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO ranks (job_id, rank, node_id, local_rank, gpu_index, pid)
            SELECT * FROM unnest(%s::bigint[], %s::int[], %s::bigint[], %s::int[], %s::int[], %s::int[])
            ON CONFLICT (job_id, rank) DO UPDATE SET
                node_id = excluded.node_id, local_rank = excluded.local_rank,
                gpu_index = excluded.gpu_index, pid = excluded.pid, updated_at = now()
            WHERE (ranks.node_id, ranks.local_rank, ranks.gpu_index, ranks.pid)
                IS DISTINCT FROM (excluded.node_id, excluded.local_rank, excluded.gpu_index, excluded.pid)
              -- A scheduler's registered map is the truth about where ranks run: a node's agent may fill in
              -- its own ranks' pids, never move another node's rank onto itself.
              AND (ranks.node_id = excluded.node_id
                   OR NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = ranks.job_id AND jobs.source = 'registered'))
            """,
            (
                [k[0] for k in changed],
                [k[1] for k in changed],
                *([latest[k][i] for k in changed] for i in range(4)),
            ),
        )
    for k in changed:
        cache.stage(("rank", *k), latest[k])


def _upsert_gpus(conn: psycopg.Connection[Any], batches: list[IngestBatch], keys: _Keys, cache: UpsertCache) -> None:
    inventory: dict[tuple[int, int], tuple[str | None, str | None, str | None]] = {}
    for batch in batches:
        if batch.heartbeat:
            for gpu in batch.heartbeat.gpus:
                inventory[(keys.nodes[batch.node], gpu.index)] = (gpu.uuid, gpu.pci_bus_id, gpu.model)
    # GPUs seen only in metrics still get a row, so a node's GPU list is never empty.
    unknown = (None, None, None)
    for batch in batches:
        for sample in batch.metrics:
            inventory.setdefault((keys.nodes[batch.node], sample.gpu), unknown)
    changed = sorted(k for k, v in inventory.items() if cache.needs_write(("gpu", *k), v, partial=v == unknown))
    if not changed:
        return
    with conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO gpus (node_id, index, uuid, pci_bus_id, model, last_seen_at)
            SELECT n, i, u, p, m, now() FROM unnest(%s::bigint[], %s::smallint[], %s::text[], %s::text[],
                                                    %s::text[]) AS t(n, i, u, p, m)
            ON CONFLICT (node_id, index) DO UPDATE SET
                uuid = COALESCE(excluded.uuid, gpus.uuid),
                pci_bus_id = COALESCE(excluded.pci_bus_id, gpus.pci_bus_id),
                model = COALESCE(excluded.model, gpus.model),
                last_seen_at = excluded.last_seen_at
            """,
            (
                [k[0] for k in changed],
                [k[1] for k in changed],
                *([inventory[k][i] for k in changed] for i in range(3)),
            ),
        )
    for k in changed:
        cache.stage(("gpu", *k), inventory[k])
