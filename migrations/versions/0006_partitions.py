"""partitions: metric samples (hourly) and log events, process snapshots, stack dumps (daily) range-partitioned by time

Retention becomes a partition drop instead of a row-by-row DELETE that could not keep up with 59 M metric
rows an hour at 16,384 GPUs (periods and why: service/maintenance/partitions.py). Each table is converted
in place, keeping every row: the old table is renamed, a partitioned parent with the same columns is
created, partitions cover the existing rows (rows older than a retention's worth go to one catch-all
`<table>_before_<stamp>` partition, rather than hundreds of hourly ones) and the next hours, a DEFAULT
partition catches the rest, the rows are copied, indexes are built once per partition after the copy,
and the old table is dropped. agent_batches stays a plain table (its batch_id key must stay globally
unique). Primary keys gain the partition key: (id, ts). No foreign key points at these tables.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 06:00:00
"""

from collections.abc import Callable, Sequence
from datetime import timedelta

import sqlalchemy as sa
from alembic import op

from service.maintenance import partitions

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# How far back a period gets its own partition when converting (the default retentions); older rows share
# one catch-all partition, dropped whole once retention passes its upper bound.
_LOOKBACK = {
    "metric_samples": timedelta(hours=72),
    "log_events": timedelta(days=30),
    "process_snapshots": timedelta(days=30),
    "stack_dumps": timedelta(days=30),
}


def _partitioned_indexes(table: str) -> None:
    """The indexes the queries use, built on the partitioned parent (and so on every partition)."""
    if table == "metric_samples":
        op.create_index("ix_metric_samples_job_id_ts", "metric_samples", ["job_id", "ts"])
        op.create_index("ix_metric_samples_node_id_ts", "metric_samples", ["node_id", "ts"])
        # A few pages per hourly partition: scans of a time range across jobs (window aggregation, ad hoc)
        # without a btree on ts; rows arrive in time order, which is what BRIN needs.
        op.create_index("ix_metric_samples_ts", "metric_samples", ["ts"], postgresql_using="brin")
    elif table == "log_events":
        op.create_primary_key("pk_log_events", "log_events", ["id", "ts"])
        op.create_index("ix_log_events_job_id_ts", "log_events", ["job_id", "ts"])
        op.create_index("ix_log_events_node_id_ts", "log_events", ["node_id", "ts"])
        # Includes ts, the partition key, so it can stay unique on a partitioned table.
        op.create_index(
            "uq_log_events_alert",
            "log_events",
            [sa.text("(fields ->> 'fingerprint')"), "ts"],
            unique=True,
            postgresql_where="source = 'alertmanager'",
        )
    elif table == "process_snapshots":
        op.create_primary_key("pk_process_snapshots", "process_snapshots", ["id", "ts"])
        op.create_index("ix_process_snapshots_job_id_ts", "process_snapshots", ["job_id", "ts"])
        op.create_index("ix_process_snapshots_node_id_ts", "process_snapshots", ["node_id", "ts"])
    elif table == "stack_dumps":
        op.create_primary_key("pk_stack_dumps", "stack_dumps", ["id", "ts"])
        op.create_index("ix_stack_dumps_job_id_ts", "stack_dumps", ["job_id", "ts"])
        op.create_index("ix_stack_dumps_directive_id", "stack_dumps", ["directive_id"])


def _plain_indexes(table: str) -> None:
    """The indexes as of revision 0005."""
    if table == "metric_samples":
        op.create_index("ix_metric_samples_job_id_ts", "metric_samples", ["job_id", "ts"])
        op.create_index("ix_metric_samples_node_id_ts", "metric_samples", ["node_id", "ts"])
    elif table == "log_events":
        op.create_primary_key("pk_log_events", "log_events", ["id"])
        op.create_index("ix_log_events_job_id_ts", "log_events", ["job_id", "ts"])
        op.create_index("ix_log_events_node_id_ts", "log_events", ["node_id", "ts"])
        op.create_index(
            "uq_log_events_alert",
            "log_events",
            [sa.text("(fields ->> 'fingerprint')"), "ts"],
            unique=True,
            postgresql_where="source = 'alertmanager'",
        )
    elif table == "process_snapshots":
        op.create_primary_key("pk_process_snapshots", "process_snapshots", ["id"])
        op.create_index("ix_process_snapshots_job_id_ts", "process_snapshots", ["job_id", "ts"])
        op.create_index("ix_process_snapshots_node_id_ts", "process_snapshots", ["node_id", "ts"])
    elif table == "stack_dumps":
        op.create_primary_key("pk_stack_dumps", "stack_dumps", ["id"])
        op.create_index("ix_stack_dumps_job_id_ts", "stack_dumps", ["job_id", "ts"])
        op.create_index("ix_stack_dumps_directive_id", "stack_dumps", ["directive_id"])


def _identity_sequence(table: str) -> str | None:
    sql = sa.text(
        "SELECT pg_get_serial_sequence(attrelid::regclass::text, attname) FROM pg_attribute "
        "WHERE attrelid = CAST(:t AS regclass) AND attidentity <> ''"
    )
    return op.get_bind().execute(sql, {"t": table}).scalar()


def _set_aside(table: str, suffix: str) -> str:
    """Rename the table (and its identity sequence) out of the way and drop its indexes and primary key,
    whose names the new table takes; return the new name."""
    conn = op.get_bind()
    aside = f"{table}_{suffix}"
    op.rename_table(table, aside)
    sequence = _identity_sequence(aside)
    if sequence is not None:
        op.execute(f"ALTER SEQUENCE {sequence} RENAME TO {aside}_id_seq")
    for name, is_pk in conn.execute(
        sa.text(
            "SELECT c.relname, i.indisprimary FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = CAST(:t AS regclass)"
        ),
        {"t": aside},
    ).all():
        if is_pk:
            op.execute(f"ALTER TABLE {aside} DROP CONSTRAINT {name}")
        else:
            op.execute(f"DROP INDEX {name}")
    return aside


def _copy_identity(table: str, source: str) -> None:
    """The new identity sequence continues where the old one stopped, so ids are never reused."""
    new = _identity_sequence(table)
    if new is not None:
        op.execute(f"SELECT setval('{new}', last_value, is_called) FROM {source}_id_seq")


def _move_rows(table: str, source: str) -> None:
    op.execute(f"INSERT INTO {table} SELECT * FROM {source}")
    op.execute(f"DROP TABLE {source}")


def _to_partitioned(table: str) -> None:
    spec = partitions.REGISTRY[table]
    conn = op.get_bind()
    old = _set_aside(table, "unpartitioned")
    op.execute(
        f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING IDENTITY) PARTITION BY RANGE ({spec.column})"
    )
    _copy_identity(table, old)
    now, oldest = conn.execute(sa.text(f"SELECT now(), min({spec.column}) FROM {old}")).one()
    start = spec.period.floor(now - _LOOKBACK[table])
    if oldest is None or oldest > start:
        start = spec.period.floor(oldest if oldest is not None and oldest < now else now)
    partitions.ensure_table_partitions(conn, spec, start=start, end=now + partitions.DEFAULT_AHEAD)
    if oldest is not None and oldest < start:
        name = f"{table}_before_{start.strftime(spec.period.stamp)}"
        partitions.create_partition(conn, spec, start=None, end=start, name=name)
    _move_rows(table, old)
    _partitioned_indexes(table)


def _to_plain(table: str) -> None:
    old = _set_aside(table, "partitioned")
    op.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING IDENTITY)")
    _copy_identity(table, old)
    _move_rows(table, old)  # dropping the parent drops its partitions
    _plain_indexes(table)


_TABLES: tuple[str, ...] = ("metric_samples", "log_events", "process_snapshots", "stack_dumps")


def _each(convert: Callable[[str], None]) -> None:
    for table in _TABLES:
        convert(table)


def upgrade() -> None:
    _each(_to_partitioned)


def downgrade() -> None:
    _each(_to_plain)
