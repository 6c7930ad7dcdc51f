"""Shared-cause incidents as the API shows them: the component, its members, the evidence and the cordons."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.decisions.schemas import DecisionOut
from service.pagination import page_config


class MemberOut(BaseModel):
    # Read from the incident's JSON list of dicts, not from a row.
    node_id: int
    node: str | None
    joined_at: datetime = Field(description="When the node's findings joined the incident.")


_EXAMPLE: dict[str, Any] = {
    "id": 3,
    "component_kind": "switch",
    "component": "leaf-7",
    "state": "open",
    "summary": "network findings on 8 of the 8 nodes with switch leaf-7 within 12 s (...): the switch "
    "is the likely cause",
    "members": [{"node_id": 17, "node": "gpu-node-017", "joined_at": "2026-11-29T01:00:05Z"}],
    "evidence": {"categories": ["network"], "label": "switch", "value_nodes": 8, "lift": 8.0},
    "opened_at": "2026-11-29T01:00:05Z",
    "updated_at": "2026-11-29T01:00:17Z",
    "resolved_at": None,
    "resolution": None,
}


class SharedIncidentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_EXAMPLE]})

    id: int
    component_kind: str = Field(
        description="switch, rack, power_domain, driver, firmware, kernel, storage or nvlink_domain."
    )
    component: str = Field(description="The switch's name, the driver version, the mount, the NVLink cluster UUID...")
    state: str = Field(description="open or resolved.")
    summary: str
    members: list[MemberOut]
    evidence: dict[str, Any] = Field(
        description="`categories` it explains; the label, how many nodes carry the value (`value_nodes`) of how many "
        "labelled (`labelled_nodes`), how many had such findings (`faulty_nodes`), `lift` and `chance` (the odds "
        "of so many landing on the value by accident), the finding ids."
    )
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    resolution: str | None


class SharedIncidentDetail(SharedIncidentOut):
    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [{**_EXAMPLE, "decisions": []}]})

    decisions: list[DecisionOut] = Field(
        default_factory=list, description="The cordons decided for the component, one per member."
    )


class SharedIncidentPage(BaseModel):
    model_config = page_config(SharedIncidentOut)

    items: list[SharedIncidentOut]
    next_cursor: str | None = None


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "leaf-7 replaced; links up"}]})

    reason: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=400)] = Field(
        description="Why a person closes it: the component repaired (its members stay cordoned until returned)."
    )
