"""job workloads: how dcgm-exporter's labels name a job (its pods' namespace and name prefix, the scheduler's job id)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("pods_namespace", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("pods_prefix", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("scheduler_job_id", sa.Text(), nullable=True))
    # Ingest looks running jobs up by the HPC job id dcgm-exporter labels a GPU with.
    op.create_index(
        "ix_jobs_scheduler_job_id", "jobs", ["scheduler_job_id"], postgresql_where=sa.text("state = 'running'")
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_scheduler_job_id", table_name="jobs")
    op.drop_column("jobs", "scheduler_job_id")
    op.drop_column("jobs", "pods_prefix")
    op.drop_column("jobs", "pods_namespace")
