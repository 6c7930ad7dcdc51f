"""Requests from the service to agents, delivered in ingest answers (e.g. "dump the stacks of job X", "run the
stop-time checks on node Y")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, SmallInteger, Text, Uuid, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

# checkpoint: a planned maintenance window is near; the job should save a checkpoint (service/planned/).
# bundle: a decision is about to take the node out; its agent uploads an evidence bundle (service/bundles/).
DIRECTIVE_KINDS = ("dump_stacks", "run_checks", "checkpoint", "bundle")


class Directive(Base):
    """Every agent of the job (or the one agent of the node) receives it with each ingest answer until it expires;
    agents act once per id."""

    __tablename__ = "directives"
    __table_args__ = (
        CheckConstraint(in_check("kind", DIRECTIVE_KINDS), name="kind"),
        Index("ix_directives_expires_at", "expires_at"),
        Index("ix_directives_job_id", "job_id"),
        # A job's directives go to its agents (dump_stacks); a node's to its agent alone (run_checks, bundle).
        CheckConstraint("(job_id IS NULL) <> (node_id IS NULL)", name="target"),
        Index("ix_directives_node_id", "node_id", postgresql_where=text("node_id IS NOT NULL")),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    job_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("nodes.id", ondelete="CASCADE"))
    # What the agent needs to act (run_checks: level, force, peer), sent with the directive; a hang's second look:
    # the machines its first look named (kept by the service).
    params: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    kind: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    requested_by: Mapped[str] = mapped_column(Text)
    # Why the service itself asked: "hang" (localize a stall), "failslow" (one of several rounds); None: a person.
    purpose: Mapped[str | None] = mapped_column(Text)
    round: Mapped[int | None] = mapped_column(SmallInteger)
    # Rounds of one fail-slow localization share this id; a hang's confirming look (round 2) holds its first look's.
    campaign_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime]
