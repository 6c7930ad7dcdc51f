"""The fleet circuit breaker as the API shows it, and a person's reset."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class BreakerEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: Literal["tripped", "reset"]
    at: datetime
    actor: str = Field(description="`faultline` for a trip; the person (their token's actor) for a reset")
    reason: str
    details: dict[str, Any]


_EXAMPLE = {
    "state": "tripped",
    "enabled": True,
    "tripped_at": "2026-11-29T00:41:07Z",
    "tripped_reason": "taking gpu-node-117 out would make 5 of 40 nodes (12%) out by automatic decisions since "
    "2026-11-28 00:41 UTC, over the limit of 4 (10% of the fleet)",
    "out_nodes": 5,
    "fleet_nodes": 40,
    "limit_nodes": 4,
    "held_decisions": 8,
    "out_now": 4,
    "limit_now": 4,
    "fleet_now": 40,
    "counting_since": "2026-11-28T00:41:09Z",
    "reset_at": None,
    "reset_by": None,
    "reset_reason": None,
    "events": [
        {
            "id": 1,
            "kind": "tripped",
            "at": "2026-11-29T00:41:07Z",
            "actor": "faultline",
            "reason": "taking gpu-node-117 out would make 5 of 40 nodes (12%) out ...",
            "details": {"out": 5, "fleet": 40, "limit": 4, "node": "gpu-node-117"},
        }
    ],
}


class BreakerOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE]})

    state: Literal["closed", "tripped"] = Field(
        description="closed: automatic decisions go to schedulers; tripped: every decision that would take a node "
        "out (evict, cordon, diagnose) or reset a GPU waits for a person (awaiting_approval) until a reset"
    )
    enabled: bool = Field(description="FAULTLINE_BREAKER_ENABLED: false never trips it")
    tripped_at: datetime | None
    tripped_reason: str | None
    out_nodes: int | None = Field(description="At the last trip: nodes out, the one that tripped it included")
    fleet_nodes: int | None = Field(description="At the last trip: nodes in the fleet")
    limit_nodes: int | None = Field(description="At the last trip: the most allowed out")
    held_decisions: int = Field(description="Decisions the breaker held that still wait for a person")
    out_now: int = Field(
        description="Nodes faultline took out automatically, within the window since the last reset, still out"
    )
    limit_now: int = Field(description="The most allowed out for the fleet's size now")
    fleet_now: int = Field(description="Nodes in the fleet now")
    counting_since: datetime = Field(description="Take-outs from then on count: the window's start or the last reset")
    reset_at: datetime | None
    reset_by: str | None
    reset_reason: str | None
    events: list[BreakerEventOut] = Field(description="The audit trail, newest first (at most 20)")


class ResetIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"reason": "rule fix deployed (PR 812); the 9 held evictions rejected"}]},
    )

    reason: str = Field(min_length=1, max_length=1000, description="Why automation may resume: kept in the audit trail")

    @field_validator("reason")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("reason must say why the breaker may be reset")
        return value.strip()
