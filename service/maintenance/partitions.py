"""Time-partitioned signal tables: one registry, partitions made ahead of time, retention by dropping them.

Every registered table is a PostgreSQL RANGE-partitioned table on its time column, with one partition per
period (named `<table>_pYYYYMMDDHH` for hours, `<table>_pYYYYMMDD` for days, in UTC) and a DEFAULT
partition (`<table>_default`) that catches any row no partition covers, so an insert never fails for lack
of a partition (a replayed spool, a skewed clock, a test writing at an arbitrary time). A conversion may
also leave one `<table>_before_<stamp>` partition holding every older row (see migration 0006).

Retention drops whole partitions: dropping a partition costs the same whatever it holds, where a
row-by-row DELETE costs work per row and leaves dead tuples for vacuum.

Locks. A partition is made with CREATE TABLE (LIKE parent) and ATTACH PARTITION, which takes only
SHARE UPDATE EXCLUSIVE on the parent (ingest keeps writing) and ACCESS EXCLUSIVE on the default partition,
which the attach scans to prove it holds no row of the new range; keep the default partition small.
Dropping a partition (DETACH) needs ACCESS EXCLUSIVE on the parent: it waits for in-flight statements, so
the service functions bound the wait with `lock_timeout` and the next beat run retries; the partition itself
is locked without waiting (see drop_partition), so the parent is held only for the catalog change. Every
change to a table's partitions runs under a transaction-level advisory lock, so concurrent callers (two
beats, beat and a migration) take turns and the second finds the work done.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from service.config import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# First key of the advisory lock that serializes partition changes (the second is the table's name hash).
_LOCK_CLASS = 0x5041_5254  # "PART"
# A partition change waits at most this long for a table lock; the next run retries.
LOCK_TIMEOUT = "3s"
# Beat keeps partitions this far ahead of the clock, so a missing beat for hours costs nothing.
DEFAULT_AHEAD = timedelta(hours=12)
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class Period:
    """The span of one partition; bounds are aligned in UTC."""

    name: str
    step: timedelta
    stamp: str  # strftime format of a partition's start, in its name

    def floor(self, at: datetime) -> datetime:
        at = at.astimezone(UTC)
        if self.step == timedelta(hours=1):
            return at.replace(minute=0, second=0, microsecond=0)
        return at.replace(hour=0, minute=0, second=0, microsecond=0)


HOURLY = Period("hour", timedelta(hours=1), "%Y%m%d%H")
DAILY = Period("day", timedelta(days=1), "%Y%m%d")
# Stamp length -> the period it names, to read any partition's bounds back from its name.
_BY_STAMP_LENGTH = {10: HOURLY, 8: DAILY}


def metric_retention(settings: Settings) -> timedelta:
    return timedelta(hours=settings.metric_retention_hours)


def log_retention(settings: Settings) -> timedelta:
    return timedelta(days=settings.log_retention_days)


@dataclass(frozen=True)
class PartitionedTable:
    """A table partitioned by RANGE on `column`, one partition per `period`, kept for `retention`."""

    name: str
    column: str
    period: Period
    retention: Callable[[Settings], timedelta] = field(compare=False)

    def __post_init__(self) -> None:
        # Names are spliced into DDL (partition bounds and names cannot be bind parameters).
        if not (_IDENTIFIER.match(self.name) and _IDENTIFIER.match(self.column)):
            raise ValueError(f"not a plain identifier: {self.name}.{self.column}")

    @property
    def default(self) -> str:
        return f"{self.name}_default"

    def partition_name(self, start: datetime) -> str:
        return f"{self.name}_p{start.astimezone(UTC).strftime(self.period.stamp)}"


# The registry. Periods: one partition should be a unit of retention and small enough to drop often, yet
# few enough that planning stays cheap (PostgreSQL handles a few hundred partitions well).
# - metric_samples: hourly. One row per GPU per second is 59 M rows an hour at 16,384 GPUs (about 10 GiB
#   with indexes, see `faultline bench storage`); retention is counted in hours (72 by default), so 72-84
#   partitions, and an hour past retention is dropped within the next beat run.
# - log tables: daily. Far fewer rows (log lines, process snapshots every few seconds, stack dumps on
#   request), 30-day retention: about 31 partitions; hourly ones would be 720 near-empty partitions.
# agent_batches is not partitioned: its primary key (batch_id) is the global idempotency key that ingest's
# ON CONFLICT (batch_id) relies on, and a partitioned table's unique keys must include the time column,
# which would let a replay stored on another day slip through. It is pruned by chunked DELETE instead
# (service.maintenance.service).
TABLES: tuple[PartitionedTable, ...] = (
    PartitionedTable("metric_samples", "ts", HOURLY, metric_retention),
    PartitionedTable("log_events", "ts", DAILY, log_retention),
    PartitionedTable("process_snapshots", "ts", DAILY, log_retention),
    PartitionedTable("stack_dumps", "ts", DAILY, log_retention),
    # metric_windows: daily. A tenth of metric_samples' rows (one per GPU per 10 s window, about 141 M a day
    # at 16,384 GPUs), kept as long as the samples.
    PartitionedTable("metric_windows", "window_start", DAILY, metric_retention),
    # node_samples: daily. Machine-level readings (ports, host, volumes) every node interval (5 s by default):
    # about 10 rows per node each, 4k rows/s at 2,048 nodes, a fifth of metric_samples' rate.
    PartitionedTable("node_samples", "ts", DAILY, metric_retention),
    PartitionedTable("node_windows", "window_start", DAILY, metric_retention),
    # metric_chunks: hourly, like the rows it compacts (service/maintenance/compaction.py): one row per node, GPU
    # and job for an hour (16,384 rows an hour at 16,384 GPUs), so retention counts hours the same way.
    PartitionedTable("metric_chunks", "ts_start", HOURLY, metric_retention),
)
REGISTRY: dict[str, PartitionedTable] = {t.name: t for t in TABLES}


@dataclass(frozen=True)
class Partition:
    """An existing partition, with the bounds its name gives (None: unbounded below)."""

    name: str
    lower: datetime | None
    upper: datetime


@dataclass
class Dropped:
    """What one retention run removed from one table."""

    partitions: list[str] = field(default_factory=list)
    default_rows: int = 0


# -- connection-level helpers (also for migrations: pass op.get_bind()) -------------------------------------


def _literal(at: datetime) -> str:
    # ISO 8601 with an explicit UTC offset: the same instant whatever the session's TimeZone.
    return f"'{at.astimezone(UTC).isoformat()}'"


def _lock(conn: Connection, spec: PartitionedTable) -> None:
    conn.execute(text("SELECT pg_advisory_xact_lock(:k, hashtext(:t))"), {"k": _LOCK_CLASS, "t": spec.name})


def table_exists(conn: Connection, name: str) -> bool:
    return conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": name}).scalar_one()


def parse_partition(spec: PartitionedTable, name: str) -> Partition | None:
    """The bounds of a partition named by this module; None for the default or a name it did not give."""
    match = re.fullmatch(rf"{spec.name}_(p|before_)(\d{{10}}|\d{{8}})", name)
    if match is None:
        return None
    period = _BY_STAMP_LENGTH[len(match.group(2))]
    start = datetime.strptime(match.group(2), period.stamp).replace(tzinfo=UTC)
    if match.group(1) == "before_":
        return Partition(name, None, start)
    return Partition(name, start, start + period.step)


def list_partitions(conn: Connection, spec: PartitionedTable) -> list[str]:
    """Names of the table's partitions (default included), oldest first by name."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:t AS regclass) ORDER BY c.relname"
        ),
        {"t": spec.name},
    )
    return list(rows.scalars())


def known_partitions(conn: Connection, spec: PartitionedTable) -> list[Partition]:
    """The table's partitions whose bounds their names give (not the default)."""
    return [p for p in (parse_partition(spec, name) for name in list_partitions(conn, spec)) if p is not None]


def _columns(conn: Connection, table: str) -> list[str]:
    rows = conn.execute(
        text(
            "SELECT attname FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        ),
        {"t": table},
    )
    return list(rows.scalars())


def _default_has_rows(conn: Connection, spec: PartitionedTable, lower: datetime | None, upper: datetime) -> bool:
    low = f"{spec.column} >= {_literal(lower)} AND " if lower is not None else ""
    sql = f"SELECT EXISTS (SELECT 1 FROM {spec.default} WHERE {low}{spec.column} < {_literal(upper)})"
    return bool(conn.execute(text(sql)).scalar_one())


class _DefaultChanged(Exception):
    """Rows for the new range reached the default partition between the check and the lock."""


def _attach(conn: Connection, spec: PartitionedTable, name: str, lower: datetime | None, upper: datetime) -> None:
    low = _literal(lower) if lower is not None else "MINVALUE"
    # LIKE copies columns, NOT NULL, defaults and CHECKs; ATTACH adds the parent's indexes and primary key.
    conn.execute(text(f"CREATE TABLE {name} (LIKE {spec.name} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"))
    bounds = f"FROM ({low}) TO ({_literal(upper)})"
    conn.execute(text(f"ALTER TABLE {spec.name} ATTACH PARTITION {name} FOR VALUES {bounds}"))


def _attach_moving_default_rows(
    conn: Connection, spec: PartitionedTable, name: str, lower: datetime | None, upper: datetime
) -> int:
    """Make the partition while the default holds rows of its range: detach the default, attach the new
    partition, move the rows over, reattach the default. Blocks the table meanwhile (ACCESS EXCLUSIVE)."""
    # The parent first, then the default: the order ingest takes them, so this cannot deadlock with it.
    conn.execute(text(f"LOCK TABLE ONLY {spec.name} IN ACCESS EXCLUSIVE MODE"))
    conn.execute(text(f"ALTER TABLE {spec.name} DETACH PARTITION {spec.default}"))
    _attach(conn, spec, name, lower, upper)
    columns = ", ".join(_columns(conn, spec.name))
    low = f"{spec.column} >= {_literal(lower)} AND " if lower is not None else ""
    moved = conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {spec.default} WHERE {low}{spec.column} < {_literal(upper)} "
            f"RETURNING {columns}) INSERT INTO {name} ({columns}) SELECT {columns} FROM moved"
        )
    ).rowcount
    conn.execute(text(f"ALTER TABLE {spec.name} ATTACH PARTITION {spec.default} DEFAULT"))
    return moved


def create_partition(
    conn: Connection, spec: PartitionedTable, *, start: datetime | None, end: datetime, name: str | None = None
) -> bool:
    """Create the partition [start, end) (start None: everything older than `end`) unless it exists; rows of
    that range already in the default partition move into it. True when it was created.

    The caller's transaction holds the locks until it ends: commit soon after.
    """
    name = name or spec.partition_name(start if start is not None else end)
    if not _IDENTIFIER.match(name):
        raise ValueError(f"not a plain identifier: {name}")
    _lock(conn, spec)
    if table_exists(conn, name):
        return False
    has_default = table_exists(conn, spec.default)
    if has_default and not _default_has_rows(conn, spec, start, end):
        try:
            with conn.begin_nested():
                conn.execute(text(f"LOCK TABLE ONLY {spec.name} IN SHARE UPDATE EXCLUSIVE MODE"))
                conn.execute(text(f"LOCK TABLE {spec.default} IN ACCESS EXCLUSIVE MODE"))
                if _default_has_rows(conn, spec, start, end):
                    raise _DefaultChanged
                _attach(conn, spec, name, start, end)
            return True
        except _DefaultChanged:
            pass  # the savepoint's rollback released its locks: take the exclusive path below
    if has_default:
        moved = _attach_moving_default_rows(conn, spec, name, start, end)
        if moved:
            log.info("partition %s: moved %d rows from %s", name, moved, spec.default)
    else:
        _attach(conn, spec, name, start, end)
    return True


def period_starts(spec: PartitionedTable, *, start: datetime, end: datetime) -> list[datetime]:
    """Starts of the periods that overlap [start, end]."""
    at = spec.period.floor(start)
    out = []
    while at <= end:
        out.append(at)
        at += spec.period.step
    return out


def ensure_table_partitions(conn: Connection, spec: PartitionedTable, *, start: datetime, end: datetime) -> list[str]:
    """The default partition and one partition per period overlapping [start, end]; returns those created.

    For migrations too (a new partitioned table registers itself in TABLES and calls this with
    `op.get_bind()` once its parent exists)."""
    _lock(conn, spec)
    if not table_exists(conn, spec.default):
        conn.execute(text(f"CREATE TABLE {spec.default} PARTITION OF {spec.name} DEFAULT"))
    existing = {p.name: p for p in known_partitions(conn, spec)}
    # A conversion's catch-all partition covers everything before its bound.
    floor = max((p.upper for p in existing.values() if p.lower is None), default=None)
    created = []
    for at in period_starts(spec, start=start, end=end):
        if floor is not None and at < floor:
            continue
        name = spec.partition_name(at)
        if name not in existing and create_partition(conn, spec, start=at, end=at + spec.period.step, name=name):
            created.append(name)
    return created


def drop_partition(conn: Connection, spec: PartitionedTable, name: str) -> None:
    """DETACH and DROP one partition; its files are freed at commit, after PostgreSQL releases the locks.

    The parent's lock comes first (as DETACH takes it: taking the partition's first could deadlock with a
    query that reads across partitions), then the partition's without waiting: a partition still in use
    (autovacuum, a long query) fails the attempt at once, for the next beat run to retry, instead of keeping
    the parent, which ingest writes through, locked while it waits."""
    _lock(conn, spec)
    conn.execute(text(f"LOCK TABLE ONLY {spec.name} IN ACCESS EXCLUSIVE MODE"))  # not its partitions
    conn.execute(text(f"LOCK TABLE ONLY {name} IN ACCESS EXCLUSIVE MODE NOWAIT"))
    conn.execute(text(f"ALTER TABLE {spec.name} DETACH PARTITION {name}"))
    conn.execute(text(f"DROP TABLE {name}"))


# -- service functions (beat) ----------------------------------------------------------------------------------


def _with_lock_timeout(session: Session, what: str, action: Callable[[Connection], T]) -> T | None:
    """`action` in a savepoint with a bounded lock wait; None (and a warning) if a lock was not granted."""
    conn = session.connection()
    previous = conn.execute(text("SELECT current_setting('lock_timeout')")).scalar_one()
    conn.execute(text("SELECT set_config('lock_timeout', :v, true)"), {"v": LOCK_TIMEOUT})
    try:
        with conn.begin_nested():
            return action(conn)
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        log.warning(
            "%s: a table lock was not granted (in use, or not within %s); the next run retries", what, LOCK_TIMEOUT
        )
        return None
    finally:
        conn.execute(text("SELECT set_config('lock_timeout', :v, true)"), {"v": previous})


def ensure_partitions(
    session: Session,
    *,
    now: datetime,
    ahead: timedelta = DEFAULT_AHEAD,
    behind: timedelta = timedelta(0),
    tables: Iterable[PartitionedTable] = TABLES,
) -> dict[str, list[str]]:
    """Partitions covering [now - behind, now + ahead] for each table (idempotent); returns those created.

    Tables not in the database yet (a registry entry whose migration has not run) are skipped."""
    created: dict[str, list[str]] = {}
    start, end = now - behind, now + ahead
    for spec in tables:
        conn = session.connection()
        if not table_exists(conn, spec.name):
            continue
        names = {p.name for p in known_partitions(conn, spec)}
        if all(spec.partition_name(at) in names for at in period_starts(spec, start=start, end=end)):
            continue  # the usual case: nothing to lock

        def make(c: Connection, spec: PartitionedTable = spec) -> list[str]:
            return ensure_table_partitions(c, spec, start=start, end=end)

        made = _with_lock_timeout(session, f"partitions of {spec.name}", make)
        if made:
            created[spec.name] = made
    return created


def drop_expired_partitions(
    session: Session,
    *,
    now: datetime,
    retention: Mapping[str, timedelta],
    tables: Iterable[PartitionedTable] = TABLES,
    chunk: int = 50_000,
    max_chunks: int = 20,
) -> dict[str, Dropped]:
    """Drop every partition entirely older than its table's retention (DETACH, DROP), and delete the default
    partition's expired rows in chunks (it holds only stragglers); returns what went.

    The row deletes run before the DETACH, so the exclusive lock is the transaction's last act: commit
    right after, one table per transaction."""
    out: dict[str, Dropped] = {}
    for spec in tables:
        if spec.name not in retention:
            continue
        conn = session.connection()
        if not table_exists(conn, spec.name):
            continue
        cutoff = now - retention[spec.name]
        dropped = Dropped()
        if table_exists(conn, spec.default):
            dropped.default_rows = delete_in_chunks(
                conn, spec.default, spec.column, cutoff=cutoff, chunk=chunk, max_chunks=max_chunks
            )
        expired = [p.name for p in known_partitions(conn, spec) if p.upper <= cutoff]

        for name in expired:
            # One savepoint each: a partition still in use waits for the next run without holding back the rest.
            def drop(c: Connection, spec: PartitionedTable = spec, name: str = name) -> str:
                drop_partition(c, spec, name)
                return name

            if _with_lock_timeout(session, f"expired partition {name}", drop):
                dropped.partitions.append(name)
        out[spec.name] = dropped
    session.flush()
    return out


def delete_in_chunks(
    conn: Connection, table: str, column: str, *, cutoff: datetime, chunk: int, max_chunks: int
) -> int:
    """Delete rows with `column` older than `cutoff`, `chunk` at a time, at most `max_chunks` chunks."""
    total = 0
    for _ in range(max_chunks):
        # ctid chunks: the table may have no primary key, and a bounded delete keeps each statement short.
        deleted = conn.execute(
            text(
                f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
                f"SELECT ctid FROM {table} WHERE {column} < :cutoff LIMIT :chunk))"
            ),
            {"cutoff": cutoff, "chunk": chunk},
        ).rowcount
        total += deleted
        if deleted < chunk:
            break
    return total
