"""The storage benchmark's measurements in PostgreSQL (lab/bench/storage.py): synthetic samples generated
by SQL, their size on disk and in WAL, and retention timed both ways: partition drops against an insert
probe, and the old chunked DELETEs then VACUUM."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text

from lab.bench.backend import say
from lab.bench.synthetic import COUNTERS, GAUGES
from ml.metrics import FIELD_TO_COLUMN
from service.diagnosis import windows as diagnosis_windows
from service.maintenance import compaction, partitions

METRICS = partitions.REGISTRY["metric_samples"]
CHUNKS = partitions.REGISTRY["metric_chunks"]
WINDOWS = partitions.REGISTRY["metric_windows"]
# Synthetic days no live database has rows for; partitions there are the benchmark's own.
BIG_DAY = datetime(2090, 1, 1, tzinfo=UTC)
SMALL_DAY = datetime(2091, 1, 1, tzinfo=UTC)
# The insert probe's rows: a day no partition covers, so they land in the default partition (deleted after).
PROBE_DAY = datetime(2092, 1, 1, tzinfo=UTC)
PROBE_EVERY_S = 0.005
PLAIN = "bench_storage_unpartitioned"
OLD_CHUNK = 50_000  # rows per DELETE in the old retention task (one chunk per table per 10-minute run)
OLD_RUN_S = 600
JOB_ID = -4242  # no real job has a negative id


# How the synthetic samples' values are made: "agent" as lab/bench/synthetic.py's job reports them (whole numbers
# for utilizations, clocks and temperatures, power to the milliwatt, profiling ratios to 4 decimals, counters
# rising), which is how DCGM reports them; "random" gauges uniform in [40, 100) at full float precision, the
# worst case for compression (the row layout's size does not depend on the values).
VALUE_KINDS = ("agent", "random")
# Per row: the job's utilization (breathing together, noisy per GPU) and three roughly normal noises.
_NOISES = (
    "LATERAL (SELECT random() + random() + random() - 1.5 AS n1, random() + random() + random() - 1.5 AS n2, "
    "random() + random() + random() - 1.5 AS n3) nn, LATERAL (SELECT least(100, greatest(0, 92 + 5 * sin(s / 7.0) "
    "+ (random() + random() + random() - 1.5) * 1.5)) AS u) uu"
)
_AGENT_VALUES = {
    "DCGM_FI_DEV_GPU_UTIL": "round(u)",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "round(u * 0.45 + n1 * 2)",
    "DCGM_FI_DEV_SM_CLOCK": "1980 - round(random() * 15)",
    "DCGM_FI_DEV_MEM_CLOCK": "2619",
    "DCGM_FI_DEV_GPU_TEMP": "round(45 + u * 0.25 + n2 * 0.7)",
    "DCGM_FI_DEV_MEMORY_TEMP": "round(50 + u * 0.2 + n3 * 0.7)",
    "DCGM_FI_DEV_POWER_USAGE": "round((300 + 3.5 * u + n1 * 6)::numeric, 3)",
    "DCGM_FI_DEV_FB_FREE": "12000 + g % 8",
    "DCGM_FI_DEV_FB_USED": "69000 - g % 8",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "round((u / 100 * 0.98)::numeric, 4)",
    "DCGM_FI_PROF_SM_ACTIVE": "round((u / 100 * 0.9)::numeric, 4)",
    "DCGM_FI_PROF_SM_OCCUPANCY": "round((u / 100 * 0.55)::numeric, 4)",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "round((u / 100 * 0.6 + n2 * 0.01)::numeric, 4)",
    "DCGM_FI_PROF_DRAM_ACTIVE": "round((u / 100 * 0.5 + n3 * 0.01)::numeric, 4)",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "round(1.5e9 + g * 1e7 + s * 650000.0 + random() * 3000)",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "round(s * 2.3e10 + g * 1e6)",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "round(u * 1.1e7)",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "round(u * 1.3e7)",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "round(u * 2.1e9)",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "round(u * 2.1e9)",
}


def _columns(values: str = "agent") -> list[tuple[str, str]]:
    """(column, SQL value) of each synthetic field, per second (s) and GPU (g); see VALUE_KINDS."""
    out: list[tuple[str, str]] = []
    for field in GAUGES:
        out.append((FIELD_TO_COLUMN[field], _AGENT_VALUES[field] if values == "agent" else "40 + random() * 60"))
    for i, field in enumerate(COUNTERS):
        rising = f"s * {10 ** (i % 7 + 3)}.5 + g"
        out.append((FIELD_TO_COLUMN[field], _AGENT_VALUES.get(field, "0") if values == "agent" else rising))
    return out


def _insert_sql(table: str, *, start: datetime, first_s: int, last_s: int, gpus: int, values: str = "agent") -> str:
    columns = _columns(values)
    names = ", ".join(c for c, _ in columns)
    exprs = ", ".join(v for _, v in columns)
    return (
        f"INSERT INTO {table} (ts, node_id, gpu, job_id, {names}) "
        f"SELECT timestamptz '{start.isoformat()}' + s * interval '1 second', -1 - g / 8, (g % 8)::smallint, "
        f"{JOB_ID}, {exprs} FROM generate_series({first_s}, {last_s}) s, generate_series(0, {gpus - 1}) g, {_NOISES}"
    )


def _step_s(gpus: int) -> int:
    """Seconds of samples per INSERT (one transaction each): about a million rows, dividing an hour."""
    return max((s for s in (60, 300, 600, 1200, 1800, 3600) if s * gpus <= 1_500_000), default=60)


def _generate(
    engine: Engine,
    table: str,
    *,
    start: datetime,
    seconds: int,
    gpus: int,
    what: str,
    progress: bool = True,
    values: str = "agent",
) -> float:
    """Insert `seconds` of samples of `gpus` GPUs from `start`; returns the seconds it took."""
    began = time.perf_counter()
    step = _step_s(gpus)
    for first in range(0, seconds, step):
        last = min(seconds, first + step) - 1
        with engine.begin() as conn:
            conn.execute(text(_insert_sql(table, start=start, first_s=first, last_s=last, gpus=gpus, values=values)))
        if progress and ((last + 1) % 3600 == 0 or last + 1 == seconds):
            rows = (last + 1) * gpus
            say(f"{what}: {rows:,} rows ({(last + 1) / 3600:.2f} h) in {time.perf_counter() - began:.0f} s")
    return time.perf_counter() - began


def _bench_partitions(conn: Connection, day: datetime, spec: partitions.PartitionedTable = METRICS) -> list[str]:
    prefix = f"{spec.name}_p{day:%Y}"
    return [n for n in partitions.list_partitions(conn, spec) if n.startswith(prefix)]


def _windows(engine: Engine, *, start: datetime, seconds: int) -> dict[str, Any]:
    """The 10 s windows of the generated samples, built by the diagnosis rollup (every column), one hour a
    transaction: their rows and size."""
    with engine.begin() as conn:
        partitions.ensure_table_partitions(conn, WINDOWS, start=start, end=start + timedelta(seconds=seconds - 1))
    statement = diagnosis_windows._statement("gpu", frozenset())
    began = time.perf_counter()
    for first in range(0, seconds, 3600):
        lo = start + timedelta(seconds=first)
        hi = start + timedelta(seconds=min(seconds, first + 3600))
        with engine.begin() as conn:
            conn.execute(statement, {"job": JOB_ID, "lo": lo, "hi": hi, "origin": diagnosis_windows._ORIGIN})
    rollup_s = time.perf_counter() - began
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT count(*) FROM metric_windows WHERE job_id = :j"), {"j": JOB_ID}).scalar()
        sizes = _sizes(conn, _bench_partitions(conn, start, WINDOWS))
    return {"rows": rows, "bytes": sizes, "rollup_s": round(rollup_s, 1)}


def _compact(engine: Engine, names: list[str], *, start: datetime) -> dict[str, Any]:
    """Each generated hour compacted into metric_chunks as beat does it, its rows kept (the retention timings
    below drop them): seconds, samples and chunks written, and the chunks' size."""
    began = time.perf_counter()
    samples = chunks = 0
    for name in names:
        with engine.begin() as conn:
            n_samples, n_chunks = compaction.compact_partition(conn, name, drop=False)
        samples, chunks = samples + n_samples, chunks + n_chunks
    seconds = time.perf_counter() - began
    with engine.begin() as conn:
        sizes = _sizes(conn, _bench_partitions(conn, start, CHUNKS))
    return {"seconds": round(seconds, 1), "samples": samples, "chunks": chunks, "bytes": sizes}


def _make_partitions(engine: Engine, day: datetime, hours: int) -> list[str]:
    with engine.begin() as conn:
        partitions.ensure_table_partitions(conn, METRICS, start=day, end=day + timedelta(hours=hours - 1))
        return _bench_partitions(conn, day)


def _sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    """Heap (with TOAST, free space and visibility maps) and each index kind, summed over the tables."""
    out = {"total": 0, "heap": 0}
    for name in names:
        out["total"] += conn.execute(text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": name}).scalar()
        out["heap"] += conn.execute(text("SELECT pg_table_size(CAST(:t AS regclass))"), {"t": name}).scalar()
        for index, size in conn.execute(
            text(
                "SELECT a.amname || ' (' || pg_get_indexdef(i.indexrelid, 1, true) || "
                "coalesce(', ' || nullif(pg_get_indexdef(i.indexrelid, 2, true), ''), '') || ')', "
                "pg_relation_size(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = CAST(:t AS regclass)"
            ),
            {"t": name},
        ):
            out[index] = out.get(index, 0) + size
    return out


def _checkpoint(engine: Engine) -> float:
    """Write the fresh rows out first: a partition past retention was flushed to disk hours ago, and the
    drop's timing should not include the writeback of what was just generated."""
    began = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CHECKPOINT"))
    return time.perf_counter() - began


def _settle(engine: Engine, names: list[str]) -> float:
    """As a partition past retention is: vacuumed (no autovacuum worker holds it any more, which retention's
    lock would wait for) and written out; seconds it took."""
    began = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for name in names:
            conn.execute(text(f"VACUUM {name}"))
    _checkpoint(engine)
    return time.perf_counter() - began


def _wal_lsn(engine: Engine) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar()


def _wal_since(engine: Engine, lsn: str) -> int:
    """WAL bytes written since `lsn` (by the whole server: the benchmark is its only writer)."""
    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:l AS pg_lsn))"), {"l": lsn}).scalar()
        )


class _InsertProbe:
    """Single-row inserts through metric_samples every few ms from a connection of its own, as ingest writes,
    each one timed: how long retention keeps a writer waiting on the parent table's lock."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="insert-probe", daemon=True)
        self.inserts: list[tuple[float, float]] = []  # (start, end), perf_counter seconds

    def __enter__(self) -> _InsertProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        insert = text("INSERT INTO metric_samples (ts, node_id, gpu, job_id) VALUES (:ts, -1, 0, :job)")
        n = 0
        with self._engine.connect() as conn:
            while not self._stop.is_set():
                began = time.perf_counter()
                conn.execute(insert, {"ts": PROBE_DAY + timedelta(milliseconds=n), "job": JOB_ID})
                conn.commit()
                self.inserts.append((began, time.perf_counter()))
                n += 1
                self._stop.wait(PROBE_EVERY_S)

    def longest_wait(self, start: float, end: float, *, timeout: float = 10.0) -> float:
        """The longest insert that overlapped [start, end], in seconds. A drop quicker than the probe's pause may
        overlap none: then the first insert after it stands for the writer's wait, waited for here (on a loaded
        machine the probe's thread may not have run again yet)."""
        deadline = time.perf_counter() + timeout
        while True:
            inserts = list(self.inserts)
            overlapped = [e - b for b, e in inserts if e >= start and b <= end]
            if overlapped:
                return max(overlapped)
            after = [e - b for b, e in inserts if b >= start]
            if after or time.perf_counter() > deadline or not self._thread.is_alive():
                return after[0] if after else 0.0
            time.sleep(PROBE_EVERY_S)


def _delete_probe_rows(conn: Connection) -> None:
    conn.execute(
        text("DELETE FROM metric_samples WHERE job_id = :job AND ts >= :day"), {"job": JOB_ID, "day": PROBE_DAY}
    )


def _drop_partitions(engine: Engine, names: list[str]) -> dict[str, list[float]]:
    """Retention as beat runs it, one partition a transaction: DETACH and DROP, under the parent's exclusive lock,
    then COMMIT, which releases the locks and only then frees the files (PostgreSQL unlinks dropped files after
    releasing locks, since that "may take many seconds"). Seconds of the statements, of the commit, and the
    longest wait of an insert through the parent meanwhile (the probe), per partition."""
    out: dict[str, list[float]] = {"statements": [], "commit": [], "insert_wait": []}
    with _InsertProbe(engine) as probe:
        time.sleep(0.2)  # the probe's connection is open and inserting
        for name in names:
            with engine.connect() as conn:
                began = time.perf_counter()
                conn.execute(text("SELECT set_config('lock_timeout', :v, true)"), {"v": partitions.LOCK_TIMEOUT})
                partitions.drop_partition(conn, METRICS, name)
                statements = time.perf_counter()
                conn.commit()
                done = time.perf_counter()
            time.sleep(0.05)  # an insert waiting on the lock finishes and is counted
            out["statements"].append(statements - began)
            out["commit"].append(done - statements)
            out["insert_wait"].append(probe.longest_wait(began, done))
    with engine.begin() as conn:
        _delete_probe_rows(conn)
    return out


def _total_size(conn: Connection, table: str) -> int:
    return conn.execute(text(f"SELECT pg_total_relation_size('{table}')")).scalar()


def _old_retention(engine: Engine, *, gpus: int, minutes: int) -> dict[str, Any]:
    """The retention of revision 0005 on an unpartitioned copy holding twice `minutes` of samples: the older
    half is deleted in 50,000-row DELETEs (one transaction each), then VACUUM reclaims it for reuse."""
    seconds = minutes * 60
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {PLAIN}"))
        conn.execute(text(f"CREATE TABLE {PLAIN} (LIKE metric_samples INCLUDING DEFAULTS)"))
        conn.execute(text(f"CREATE INDEX ON {PLAIN} (job_id, ts)"))
        conn.execute(text(f"CREATE INDEX ON {PLAIN} (node_id, ts)"))
    _generate(engine, PLAIN, start=BIG_DAY, seconds=2 * seconds, gpus=gpus, what="unpartitioned copy")
    with engine.begin() as conn:
        conn.execute(text(f"ANALYZE {PLAIN}"))
        before = _total_size(conn, PLAIN)
    _checkpoint(engine)
    lsn = _wal_lsn(engine)
    cutoff = BIG_DAY + timedelta(seconds=seconds)
    deleted = statements = 0
    began = time.perf_counter()
    while True:
        # The old retention's statement, one chunk per transaction as its beat task ran them.
        with engine.begin() as conn:
            n = partitions.delete_in_chunks(conn, PLAIN, "ts", cutoff=cutoff, chunk=OLD_CHUNK, max_chunks=1)
        deleted += n
        statements += 1
        if statements % 20 == 0:
            say(f"old retention: {deleted:,} rows deleted in {time.perf_counter() - began:.0f} s")
        if n < OLD_CHUNK:
            break
    delete_s = time.perf_counter() - began
    with engine.begin() as conn:
        after_delete = _total_size(conn, PLAIN)
    began = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM {PLAIN}"))
        vacuum_s = time.perf_counter() - began
        after_vacuum = _total_size(conn, PLAIN)
    wal = _wal_since(engine, lsn)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {PLAIN}"))
    return {
        "rows_kept": 2 * seconds * gpus - deleted,
        "rows": deleted,
        "statements": statements,
        "delete_s": round(delete_s, 3),
        "vacuum_s": round(vacuum_s, 3),
        "rows_per_s": round(deleted / (delete_s + vacuum_s)) if deleted else 0,
        "bytes_before": before,
        "bytes_after_delete": after_delete,
        "bytes_after_vacuum": after_vacuum,
        "wal_bytes": wal,
    }


def _cleanup(engine: Engine) -> None:
    """Partitions and tables a previous, interrupted run may have left."""
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {PLAIN}"))
        for day in (BIG_DAY, SMALL_DAY):
            for name in _bench_partitions(conn, day):
                partitions.drop_partition(conn, METRICS, name)
            for spec in (CHUNKS, WINDOWS):
                for name in _bench_partitions(conn, day, spec):
                    # Waiting for the lock: autovacuum, busy with the fresh chunks, gives way (NOWAIT would fail).
                    conn.execute(text(f"ALTER TABLE {spec.name} DETACH PARTITION {name}"))
                    conn.execute(text(f"DROP TABLE {name}"))
        _delete_probe_rows(conn)
