"""compact samples: metric_chunks (closed hours of metric_samples as per-GPU arrays) and gpu_samples(lo, hi)

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-29 04:00:00

Existing rows stay where they are: metric_samples remains the table ingest writes, and beat compacts its closed
hours into metric_chunks from now on (service/maintenance/compaction.py), old hours included. The downgrade
expands every chunk back into metric_samples rows (into the default partition where an hour's partition is
gone), so no sample is lost either way.
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from service.maintenance import compaction, partitions

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _metric_columns() -> list[tuple[str, bool]]:
    """metric_samples' metric columns as the database has them (name, float8): the chunks mirror them."""
    rows = op.get_bind().execute(
        sa.text(
            "SELECT attname, atttypid = 'float8'::regtype FROM pg_attribute WHERE attrelid = 'metric_samples'::regclass "
            "AND attnum > 0 AND NOT attisdropped AND attname NOT IN ('ts', 'node_id', 'gpu', 'job_id', 'extra') "
            "ORDER BY attnum"
        )
    )
    return [(name, bool(double)) for name, double in rows]


def upgrade() -> None:
    columns = _metric_columns()
    for statement in compaction.chunk_table_sql(columns):
        op.execute(statement)
    op.execute(compaction.PREFIX_SUM_SQL)
    op.execute(compaction.reader_function_sql(columns))
    now = datetime.now(UTC)
    spec = partitions.REGISTRY["metric_chunks"]
    partitions.ensure_table_partitions(op.get_bind(), spec, start=now, end=now + partitions.DEFAULT_AHEAD)


def downgrade() -> None:
    columns = _metric_columns()
    names = ", ".join(name for name, _ in columns)
    op.execute(
        f"INSERT INTO metric_samples (ts, node_id, gpu, job_id, {names}, extra) "
        + compaction.chunk_samples_sql(columns, "true")
    )
    op.execute("DROP FUNCTION gpu_samples(timestamptz, timestamptz)")
    op.execute("DROP FUNCTION faultline_prefix_sum(float8[])")
    op.execute("DROP TABLE metric_chunks")
