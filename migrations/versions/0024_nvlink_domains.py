"""nvlink domains: each GPU's NVLink fabric (its fabric cluster, the NVLink domain of a GB200 NVL72 rack, its clique,
and its registration's state and health, from NVML's fabric info), for domain incidents and the scheduler API

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("fabric_cluster_uuid", sa.Text()),
    ("fabric_clique_id", sa.BigInteger()),
    ("fabric_state", sa.Text()),
    ("fabric_status", sa.Integer()),
    ("fabric_health", sa.Text()),
    ("fabric_degraded_bw", sa.Boolean()),
    ("fabric_gfm", sa.Text()),
    ("fabric_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column("gpus", sa.Column(name, kind, nullable=True))
    # The domains API and the domain check group GPUs by their cluster: only fabric GPUs are indexed.
    op.create_index(
        "ix_gpus_fabric_cluster_uuid",
        "gpus",
        ["fabric_cluster_uuid"],
        postgresql_where=sa.text("fabric_cluster_uuid IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_gpus_fabric_cluster_uuid", table_name="gpus")
    for name, _ in reversed(_COLUMNS):
        op.drop_column("gpus", name)
