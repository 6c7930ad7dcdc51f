"""API tokens, stored as SHA-256 hashes: the plain token is shown once, at creation."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Identity, Index, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

# "enrol": a token an agent exchanges, once per node, for its own node-bound agent token (service/tokens/enrolment.py).
SCOPES = ("agent", "scheduler", "operator", "admin", "enrol")
# Who may hold a web UI session: never an enrolment token.
SESSION_SCOPES = ("agent", "scheduler", "operator", "admin")


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint(in_check("scope", SCOPES), name="scope"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    token_hash: Mapped[str] = mapped_column(Text, unique=True)
    # First characters of the token, to tell tokens apart in listings without revealing them.
    prefix: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    scope: Mapped[str] = mapped_column(Text)
    # An agent token bound to a node may only write that node's data.
    node_name: Mapped[str | None] = mapped_column(Text)
    # An enrolment token enrols only nodes whose name matches this shell-style pattern (e.g. gpu-*).
    node_pattern: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class UiSession(Base):
    """A signed-in web UI user. The cookie holds a random key; only its hash is stored, so a leaked
    table opens no session. Deleting the row signs the user out everywhere at once."""

    __tablename__ = "ui_sessions"
    __table_args__ = (
        CheckConstraint(in_check("scope", SESSION_SCOPES), name="scope"),
        Index("ix_ui_sessions_expires_at", "expires_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    key_hash: Mapped[str] = mapped_column(Text, unique=True)
    # The operator token used to sign in; null for a user an authenticating proxy vouched for.
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"))
    user_name: Mapped[str] = mapped_column(Text)
    scope: Mapped[str] = mapped_column(Text)
    # Synchronizer token: every form and htmx request must echo it.
    csrf_token: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime]


class AgentEnrolment(Base):
    """A node's exchange of an enrolment token for its own agent token: one per node while that token lives."""

    __tablename__ = "agent_enrolments"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    node_name: Mapped[str] = mapped_column(Text, index=True)
    enrolment_token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    agent_token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), unique=True)
    created_at: Mapped[datetime] = created_at_column()
