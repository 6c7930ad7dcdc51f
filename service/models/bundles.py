"""Evidence bundles: what a node's agent collected (kernel log, GPU state, diagnostics, its last samples, stacks) when
a decision was about to take the node out, kept with the decision and its incident for the repair team."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, LargeBinary, Text, Uuid
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, deferred, mapped_column

from service.models.base import Base, in_check

# requested: the `bundle` directive is out and nothing came back yet (past its deadline the API and UI say "no
# bundle: agent unreachable"); stored: the agent's tar.gz is here.
BUNDLE_STATES = ("requested", "stored")


class EvidenceBundle(Base):
    """One bundle per decision; its id is the id of the `bundle` directive that asked for it."""

    __tablename__ = "evidence_bundles"
    __table_args__ = (
        CheckConstraint(in_check("state", BUNDLE_STATES), name="state"),
        CheckConstraint("(state = 'stored') = (content IS NOT NULL)", name="content"),
        Index("uq_evidence_bundles_decision_id", "decision_id", unique=True),
        Index("ix_evidence_bundles_incident_id", "incident_id"),
        Index("ix_evidence_bundles_node_id_requested_at", "node_id", "requested_at"),
        Index("ix_evidence_bundles_requested_at", "requested_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    decision_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("decisions.id", ondelete="CASCADE"))
    incident_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("incidents.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("nodes.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(Text)
    requested_at: Mapped[datetime]
    # Past this with nothing stored, the node's agent did not answer: "no bundle: agent unreachable".
    deadline_at: Mapped[datetime]
    stored_at: Mapped[datetime | None]
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(Text)
    # The agent's manifest.json: each part, its size, how long it took, truncated or not, its error.
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The tar.gz itself, loaded only for a download (TOAST keeps it out of line; lists never read it).
    content: Mapped[bytes | None] = deferred(mapped_column(LargeBinary))
