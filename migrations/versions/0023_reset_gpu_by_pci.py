"""reset gpu by pci: a reset_gpu decision names its GPU by index, or by PCI bus id when the node's GPU inventory
does not know the index (no NVML, a kernel-log-only agent, a replayed kernel log)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "(kind = 'reset_gpu') = (gpu IS NOT NULL)"
_NEW = "(kind = 'reset_gpu') = (gpu IS NOT NULL OR gpu_pci IS NOT NULL)"
# The one form the policy writes (the Xid line's address with its function): adapters pass it to nvidia-smi.
_PCI_FORM = r"gpu_pci ~ '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$'"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("gpu_pci", sa.Text(), nullable=True))
    op.drop_constraint(op.f("ck_decisions_gpu"), "decisions", type_="check")
    op.create_check_constraint(op.f("ck_decisions_gpu"), "decisions", _NEW)
    op.create_check_constraint(op.f("ck_decisions_gpu_pci"), "decisions", _PCI_FORM)


def downgrade() -> None:
    # A reset by PCI bus id cannot be written without its index: such decisions go, as 0010's downgrade drops
    # every reset_gpu.
    op.execute("DELETE FROM decisions WHERE kind = 'reset_gpu' AND gpu IS NULL")
    op.drop_constraint(op.f("ck_decisions_gpu_pci"), "decisions", type_="check")
    op.drop_constraint(op.f("ck_decisions_gpu"), "decisions", type_="check")
    op.create_check_constraint(op.f("ck_decisions_gpu"), "decisions", _OLD)
    op.drop_column("decisions", "gpu_pci")
