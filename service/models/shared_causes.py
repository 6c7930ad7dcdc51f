"""Shared-cause (fleet) incidents: one component (a switch, a rack, a driver version, a storage mount...) to blame
for findings on several nodes at once; service/shared_causes/."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

# What a shared incident blames: a place in the fleet (rack, leaf switch, power domain, NVLink domain), a version
# the nodes run (driver, GPU firmware, kernel), or a storage mount they read.
COMPONENT_KINDS = ("switch", "rack", "power_domain", "driver", "firmware", "kernel", "storage", "nvlink_domain")
SHARED_INCIDENT_STATES = ("open", "resolved")


class SharedIncident(Base):
    """Findings on several nodes explained by one component they share: decided for the component (its members
    cordoned from new work, one notification), not node by node."""

    __tablename__ = "shared_incidents"
    __table_args__ = (
        CheckConstraint(in_check("component_kind", COMPONENT_KINDS), name="component_kind"),
        CheckConstraint(in_check("state", SHARED_INCIDENT_STATES), name="state"),
        # One open incident per component, however many workers see its nodes fail at once.
        Index(
            "uq_shared_incidents_open_component",
            "component_kind",
            "component",
            unique=True,
            postgresql_where=text("state = 'open'"),
        ),
        Index("ix_shared_incidents_opened_at", "opened_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    component_kind: Mapped[str] = mapped_column(Text)
    # The switch's name, the driver version, the mount point, the NVLink fabric cluster UUID...
    component: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, server_default="open")
    summary: Mapped[str] = mapped_column(Text)
    # [{"node_id", "node", "joined_at"}], in the order they joined.
    members: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    # Why: the finding categories it explains ("categories"), the label's share of the fleet, the findings seen.
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    opened_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = created_at_column()
    resolved_at: Mapped[datetime | None]
    # Why it resolved: quiet (no member found anything for a while), or closed by a person.
    resolution: Mapped[str | None] = mapped_column(Text)
