"""Compact GPU sample storage: closed hours of `metric_samples` rows become `metric_chunks`, read back by
`gpu_samples(lo, hi)`.

Ingest writes one row per GPU and timestamp into the hourly partitions of `metric_samples` (binary COPY, the
cheapest write PostgreSQL has), where the 10 s rollup finds the newest samples. About 230 bytes a sample with
its indexes: fine for the hot hour, not for 72 h of 16,384 GPUs. Once an hour has closed (COMPACT_AFTER past its
end), beat rewrites its partition as one `metric_chunks` row per node, GPU and job for the hour: the times and
every column as arrays in sample order, the way TimescaleDB's compressed chunks and Prometheus's blocks keep a
series together. PostgreSQL compresses each array (TOAST, pglz); what makes them compress:

- times: a regular series (a scrape every second) is stored as its start, step and count only; an irregular
  one as microsecond offsets from the chunk's start;
- monotone integral counters (energy, bytes, error counts) as deltas (the first value, then increments),
  listed in `deltas`: mostly small repeated numbers. Read back by a prefix sum, exact in float8 for integers
  below 2**52 (the only ones delta-encoded);
- a column no sample of the chunk reported is NULL, not an array of NULLs;
- the PCIe and NVLink byte rates (RATES_AS_REAL), float8 in the rows for their magnitude, as float4 arrays: their
  noise makes them incompressible, eight bytes a value were half of a compacted sample, and float4's 7
  significant digits are far finer than DCGM's own profiling estimate of them or the 5% the peer comparison
  reads (ml/peer_spans.py). Read back as float8, within 6e-8 of the value stored.

The rows and the chunks of one hour are swapped in one transaction (the chunks inserted, the partition
dropped), so a reader sees each sample exactly once. A sample later than that lands in the default partition
of `metric_samples` and is compacted from there on a later run, into a chunk of its own.

Readers never see the layout: `gpu_samples(lo, hi)` (a SQL function inlined into the caller's query, so its
bounds prune partitions and the callers' filters reach both tables' indexes) returns the rows of
`metric_samples` in [lo, hi) and the chunks' samples in [lo, hi), shaped as `metric_samples` rows. The 10 s
rollup, the node pages and the benchmarks read through it. A chunk spans at most an hour, so a chunk with a
sample at or after `lo` starts after `lo - 1 hour`: the bound that prunes chunk partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from ml.metrics import METRIC_COLUMNS
from service.maintenance import partitions
from service.models.signals import RATES_AS_REAL

log = logging.getLogger(__name__)

ROWS = partitions.REGISTRY["metric_samples"]
CHUNKS = partitions.REGISTRY["metric_chunks"]
# An hour is compacted this long after its end: late enough that its window rollups and the agents' retries
# (spool replays come later still, and go through the default partition) are done with it.
COMPACT_AFTER = timedelta(minutes=15)
# Nodes per compaction statement: about 8 x 3,600 rows each, so a statement sorts a few hundred MB at most.
NODES_PER_STATEMENT = 16
# Integers up to this magnitude are delta-encoded: their deltas and prefix sums stay exact in float8.
_EXACT = 2.0**52
_ORIGIN = "timestamptz '2000-01-01 00:00:00+00'"  # date_bin's origin: hours aligned in UTC


def _array_type(name: str, counter: bool) -> str:
    """A column's array type in metric_chunks."""
    return "float8[]" if counter and name not in RATES_AS_REAL else "real[]"


def _metric_columns(columns: Iterable[tuple[str, bool]] | None) -> list[tuple[str, bool]]:
    return list(columns) if columns is not None else [(name, counter) for name, (_, counter) in METRIC_COLUMNS.items()]


# -- DDL (migration 0031 passes the columns the database has) -----------------------------------------------------


def chunk_table_sql(columns: Sequence[tuple[str, bool]]) -> list[str]:
    """CREATE statements of `metric_chunks` (partitioned by hour of ts_start like the rows) and its indexes."""
    arrays = "".join(f", {name} {_array_type(name, counter)}" for name, counter in columns)
    return [
        "CREATE TABLE metric_chunks (node_id bigint NOT NULL, gpu smallint NOT NULL, job_id bigint, "
        "ts_start timestamptz NOT NULL, ts_end timestamptz NOT NULL, n integer NOT NULL, step_us bigint, "
        f"ts_off bigint[], deltas text[]{arrays}, extra jsonb[], "
        "CONSTRAINT ck_metric_chunks_times CHECK (step_us IS NOT NULL OR ts_off IS NOT NULL), "
        "CONSTRAINT ck_metric_chunks_span CHECK (ts_end >= ts_start AND ts_end - ts_start < interval '1 hour')"
        ") PARTITION BY RANGE (ts_start)",
        "CREATE INDEX ix_metric_chunks_node_id_ts_start ON metric_chunks (node_id, ts_start)",
        "CREATE INDEX ix_metric_chunks_job_id_ts_start ON metric_chunks (job_id, ts_start)",
    ]


PREFIX_SUM_SQL = (
    "CREATE OR REPLACE FUNCTION faultline_prefix_sum(float8[]) RETURNS float8[] LANGUAGE sql IMMUTABLE STRICT "
    "PARALLEL SAFE AS $$ SELECT array_agg(s ORDER BY o) FROM (SELECT sum(v) OVER (ORDER BY o ROWS UNBOUNDED "
    "PRECEDING) AS s, o FROM unnest($1) WITH ORDINALITY AS u(v, o)) z $$"
)


def chunk_samples_sql(columns: Sequence[tuple[str, bool]], where: str) -> str:
    """SELECT of the samples in metric_chunks `c` whose chunk matches `where` (which may use `{at}`, a sample's
    time), shaped as metric_samples rows."""
    names = [name for name, _ in columns]
    decoded = ", ".join(
        f"c.{name}::float8[]"
        if name in RATES_AS_REAL
        else f"CASE WHEN c.deltas @> ARRAY['{name}'] THEN faultline_prefix_sum(c.{name}) ELSE c.{name} END"
        if counter
        else f"c.{name}"
        for name, counter in columns
    )
    at = "c.ts_start + u.off * interval '1 microsecond'"
    return (
        f"SELECT {at}, c.node_id, c.gpu, c.job_id, {', '.join(f'u.{n}' for n in names)}, u.extra "
        "FROM metric_chunks c CROSS JOIN LATERAL unnest("
        "coalesce(c.ts_off, ARRAY(SELECT k * c.step_us FROM generate_series(0::bigint, c.n - 1) k)), "
        f"{decoded}, c.extra) AS u(off, {', '.join(names)}, extra) WHERE {where.format(at=at)}"
    )


def reader_function_sql(columns: Sequence[tuple[str, bool]]) -> str:
    """CREATE of `gpu_samples(lo, hi)`: metric_samples rows and metric_chunks samples with lo <= ts < hi.

    LANGUAGE sql, STABLE, not STRICT, one SELECT: PostgreSQL inlines it into the calling query."""
    names = [name for name, _ in columns]
    out = ", ".join(
        ["ts timestamptz", "node_id bigint", "gpu smallint", "job_id bigint"]
        + [f"{name} {'float8' if counter else 'real'}" for name, counter in columns]
        + ["extra jsonb"]
    )
    rows = ", ".join(f"s.{c}" for c in ["ts", "node_id", "gpu", "job_id", *names, "extra"])
    chunks = chunk_samples_sql(
        columns,
        "c.ts_start > lo_ts - interval '1 hour' AND c.ts_start < hi_ts AND c.ts_end >= lo_ts "
        "AND {at} >= lo_ts AND {at} < hi_ts",
    )
    return (
        f"CREATE OR REPLACE FUNCTION gpu_samples(lo_ts timestamptz, hi_ts timestamptz) RETURNS TABLE ({out}) "
        "LANGUAGE sql STABLE PARALLEL SAFE AS $$ "
        f"SELECT {rows} FROM metric_samples s WHERE s.ts >= lo_ts AND s.ts < hi_ts UNION ALL {chunks} $$"
    )


# -- compaction ---------------------------------------------------------------------------------------------------


def compact_sql(source: str, where: str, columns: Sequence[tuple[str, bool]] | None = None) -> str:
    """INSERT INTO metric_chunks of `source`'s rows matching `where`, one chunk per node, GPU, job and hour."""
    cols = _metric_columns(columns)
    counters = [name for name, counter in cols if counter and name not in RATES_AS_REAL]
    lags = "".join(f", lag({c}) OVER w AS {c}__prev" for c in counters)

    def delta_ok(c: str) -> str:
        return (
            f"(count(*) > 1 AND count({c}) = count(*) AND bool_and({c} = trunc({c}) AND abs({c}) < {_EXACT:.0f} "
            f"AND ({c}__prev IS NULL OR {c} >= {c}__prev)))"
        )

    def packed(name: str, counter: bool) -> str:
        raw = f"array_agg({name}::real)" if name in RATES_AS_REAL else f"array_agg({name})"
        if not counter or name in RATES_AS_REAL:
            return f"CASE WHEN count({name}) = 0 THEN NULL ELSE {raw} END"
        return (
            f"CASE WHEN count({name}) = 0 THEN NULL WHEN {delta_ok(name)} "
            f"THEN array_agg(coalesce({name} - {name}__prev, {name})) ELSE {raw} END"
        )

    regular = "(count(*) = 1 OR (min(d) = max(d) AND min(d) > 0))"
    deltas = ", ".join(f"CASE WHEN {delta_ok(c)} THEN '{c}' END" for c in counters) or "NULL"
    names = [name for name, _ in cols]
    arrays = "".join(f"{packed(name, counter)}, " for name, counter in cols)
    return (
        f"INSERT INTO metric_chunks (node_id, gpu, job_id, ts_start, ts_end, n, step_us, ts_off, deltas, "
        f"{''.join(f'{name}, ' for name in names)}extra) "
        "SELECT node_id, gpu, job_id, min(ts), max(ts), count(*), "
        f"CASE WHEN count(*) = 1 THEN 0 WHEN {regular} THEN min(d) END, "
        f"CASE WHEN {regular} THEN NULL ELSE array_agg(off) END, "
        f"nullif(array_remove(ARRAY[{deltas}]::text[], NULL), '{{}}'), {arrays}"
        "CASE WHEN count(extra) = 0 THEN NULL ELSE array_agg(extra) END "
        # The aggregates take their rows in the window's order (node, GPU, job, hour, time): GroupAggregate over
        # the WindowAgg's output, which _plan_settings keeps from being hashed or split across workers. ORDER BY
        # inside each array_agg would sort every group once per column (4x the time at 47 columns).
        "FROM (SELECT *, "
        "(extract(epoch FROM ts - first_value(ts) OVER w) * 1000000)::bigint AS off, "
        f"(extract(epoch FROM ts - lag(ts) OVER w) * 1000000)::bigint AS d{lags} "
        f"FROM (SELECT *, date_bin('1 hour', ts, {_ORIGIN}) AS hour FROM {source} WHERE {where}) r "
        "WINDOW w AS (PARTITION BY node_id, gpu, job_id, hour ORDER BY ts)) x "
        "GROUP BY node_id, gpu, job_id, hour"
    )


# (samples, chunks) of a compaction statement's `made` (its INSERT ... RETURNING n).
_COUNTED = "SELECT coalesce(sum(n), 0)::bigint, count(*) FROM made"


@dataclass
class Compacted:
    """What one compaction run rewrote."""

    partitions: list[str] = field(default_factory=list)
    rows: int = 0
    chunks: int = 0
    default_rows: int = 0
    seconds: float = 0.0


def _plan_settings(conn: Connection) -> None:
    """For the compaction statements of this transaction: sorts in memory, rows aggregated in window order."""
    for setting in ("work_mem = '256MB'", "enable_hashagg = off", "max_parallel_workers_per_gather = 0"):
        conn.execute(text(f"SET LOCAL {setting}"))


def _node_ids(conn: Connection, table: str) -> list[int]:
    """The partition's distinct node ids, by a loose scan of its (node_id, ts) index: one probe per node."""
    return list(
        conn.execute(
            text(
                f"WITH RECURSIVE t(n) AS (SELECT min(node_id) FROM {table} UNION ALL "
                f"SELECT (SELECT min(node_id) FROM {table} WHERE node_id > t.n) FROM t WHERE t.n IS NOT NULL) "
                "SELECT n FROM t WHERE n IS NOT NULL"
            )
        ).scalars()
    )


def _reported(conn: Connection, table: str) -> list[tuple[str, bool]]:
    """The metric columns with a value in `table`: one scan, cheaper than aggregating into arrays the columns no
    agent reports (a dcgm-exporter node reports about 20 of the 47), whose chunk arrays stay NULL anyway."""
    columns = _metric_columns(None)
    counts = conn.execute(text(f"SELECT {', '.join(f'count({c})' for c, _ in columns)} FROM {table}")).one()
    return [column for column, n in zip(columns, counts, strict=True) if n]


def compact_partition(conn: Connection, name: str, *, drop: bool = True) -> tuple[int, int]:
    """Rewrite one hourly partition of metric_samples as chunks, then drop it (`drop`), in the caller's
    transaction: readers see the rows or the chunks, never both. Returns (rows, chunks)."""
    part = partitions.parse_partition(ROWS, name)
    if part is None or part.lower is None:
        raise ValueError(f"not an hourly partition of {ROWS.name}: {name}")
    # Autovacuum is kept off the partition from here to the drop (it would make the drop's NOWAIT lock fail
    # and the run's work roll back); ingest's inserts of late samples are not blocked by this lock.
    conn.execute(text(f"LOCK TABLE ONLY {name} IN SHARE UPDATE EXCLUSIVE MODE NOWAIT"))
    partitions.ensure_table_partitions(conn, CHUNKS, start=part.lower, end=part.lower)
    _plan_settings(conn)
    ids = _node_ids(conn, name)
    rows = chunks = 0
    made = compact_sql(name, "node_id = ANY(:ids)", _reported(conn, name))
    statement = text(f"WITH made AS ({made} RETURNING n) {_COUNTED}")
    for i in range(0, len(ids), NODES_PER_STATEMENT):
        n_rows, n_chunks = conn.execute(statement, {"ids": ids[i : i + NODES_PER_STATEMENT]}).one()
        rows, chunks = rows + n_rows, chunks + n_chunks
    if drop:
        partitions.drop_partition(conn, ROWS, name)
    return rows, chunks


def compact_default(conn: Connection, *, cutoff: datetime) -> tuple[int, int]:
    """Late samples (before `cutoff`) in metric_samples' default partition, moved into chunks of their own."""
    if not partitions.table_exists(conn, ROWS.default):
        return 0, 0
    hours = list(
        conn.execute(
            text(f"SELECT DISTINCT date_bin('1 hour', ts, {_ORIGIN}) FROM {ROWS.default} WHERE ts < :cutoff"),
            {"cutoff": cutoff},
        ).scalars()
    )
    if not hours:
        return 0, 0
    for hour in hours:
        partitions.ensure_table_partitions(conn, CHUNKS, start=hour, end=hour)
    _plan_settings(conn)
    columns = "ts, node_id, gpu, job_id, " + ", ".join(METRIC_COLUMNS) + ", extra"
    moved = conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {ROWS.default} WHERE ts < :cutoff RETURNING {columns}), "
            f"made AS ({compact_sql('moved', 'true')} RETURNING n) {_COUNTED}"
        ),
        {"cutoff": cutoff},
    ).one()
    return int(moved[0]), int(moved[1])


def due_partitions(conn: Connection, *, now: datetime) -> list[str]:
    """Hourly partitions of metric_samples that ended COMPACT_AFTER ago or more, oldest first."""
    return [
        p.name
        for p in partitions.known_partitions(conn, ROWS)
        if p.lower is not None and p.upper + COMPACT_AFTER <= now
    ]


def compact_samples(session: Session, *, now: datetime, max_partitions: int = 1) -> Compacted:
    """Compact up to `max_partitions` closed hours of metric_samples and the default partition's late samples.

    Each partition in a savepoint with a bounded lock wait (the drop's exclusive lock on metric_samples): one
    still in use stays for the next run, rows and all."""
    began = time.perf_counter()
    out = Compacted()
    conn = session.connection()
    for name in due_partitions(conn, now=now)[:max_partitions]:

        def compact(c: Connection, name: str = name) -> tuple[int, int]:
            return compact_partition(c, name)

        done = partitions._with_lock_timeout(session, f"compaction of {name}", compact)
        if done is not None:
            out.partitions.append(name)
            out.rows += done[0]
            out.chunks += done[1]
    late = compact_default(conn, cutoff=partitions.HOURLY.floor(now - COMPACT_AFTER))
    out.default_rows, out.chunks = late[0], out.chunks + late[1]
    session.flush()
    out.seconds = time.perf_counter() - began
    return out
