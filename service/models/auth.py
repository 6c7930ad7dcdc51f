"""API tokens, stored as SHA-256 hashes: the plain token is shown once, at creation."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, Identity, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

SCOPES = ("agent", "scheduler", "operator", "admin")


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
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
