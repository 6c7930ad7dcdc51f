"""one incident per fault: a machine's fault is its own incident (job, root cause, machine), not the job's

Revision ID: 0019
Revises: 0017
Create Date: 2026-11-27 02:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OPEN = sa.text("state <> 'resolved'")


def upgrade() -> None:
    # The machine a machine fault's incident is about ('' for a job-wide one: a hang being localized, a user's
    # bug): two machines' faults of one kind in one job are two incidents, each decided on its own.
    op.add_column("incidents", sa.Column("anchor", sa.Text(), server_default="", nullable=False))
    op.drop_index("uq_incidents_open_job_root_cause", table_name="incidents", postgresql_where=_OPEN)
    op.create_index(
        "uq_incidents_open_job_root_cause_anchor",
        "incidents",
        ["job_id", "root_cause", "anchor"],
        unique=True,
        postgresql_where=_OPEN,
    )


def downgrade() -> None:
    # Older code keeps one open incident per job and root cause: the newest of each group stays open.
    op.execute(
        """
        UPDATE incidents SET state = 'resolved', resolved_at = now(), resolution = 'merged: downgrade to 0017'
        WHERE state <> 'resolved' AND id NOT IN (
            SELECT max(id) FROM incidents WHERE state <> 'resolved' GROUP BY job_id, root_cause
        )
        """
    )
    op.drop_index("uq_incidents_open_job_root_cause_anchor", table_name="incidents", postgresql_where=_OPEN)
    op.create_index(
        "uq_incidents_open_job_root_cause", "incidents", ["job_id", "root_cause"], unique=True, postgresql_where=_OPEN
    )
    op.drop_column("incidents", "anchor")
