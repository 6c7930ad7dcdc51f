"""The scheduler API's view of NVLink domains: /api/v1/nvlink-domains."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class DomainNodeOut(BaseModel):
    name: str
    state: str = Field(description="The node's state (healthy, suspect, cordoned, evicted, in_repair, returning).")
    cliques: list[int] = Field(description="The NVLink cliques its GPUs are in (one on a healthy tray).")
    gpus: int = Field(description="Its GPUs in this domain.")
    fabric_manager: str | None = Field(description="Its own fabric manager where it runs one: running or stopped.")
    trouble: list[str] = Field(description="What its fabric shows wrong now; empty when nothing.")
    usable: bool = Field(description="A tensor-parallel group may be placed on it now.")
    last_seen_at: datetime | None


class CliqueOut(BaseModel):
    clique_id: int
    nodes: list[str]


_EXAMPLE = {
    "cluster_uuid": "6a7c1f3e-2b5d-4e8f-9a01-3c4d5e6f7a8b",
    "state": "degraded",
    "healthy": False,
    "summary": "one tray's NVLink fabric failing: nvl72-a-tray05: GPU 2 fabric unhealthy; 4 NVLink finding(s)",
    "nodes": [
        {
            "name": "nvl72-a-tray04",
            "state": "healthy",
            "cliques": [32766],
            "gpus": 4,
            "fabric_manager": None,
            "trouble": [],
            "usable": True,
            "last_seen_at": "2026-11-29T01:00:02Z",
        },
        {
            "name": "nvl72-a-tray05",
            "state": "evicted",
            "cliques": [32766],
            "gpus": 4,
            "fabric_manager": None,
            "trouble": ["GPU 2 fabric unhealthy", "4 NVLink finding(s)"],
            "usable": False,
            "last_seen_at": "2026-11-29T01:00:01Z",
        },
    ],
    "cliques": [{"clique_id": 32766, "nodes": ["nvl72-a-tray04", "nvl72-a-tray05"]}],
    "usable_nodes": ["nvl72-a-tray04"],
    "shared_incident_id": None,
}


class DomainOut(BaseModel):
    model_config = {"json_schema_extra": {"examples": [_EXAMPLE]}}

    cluster_uuid: str = Field(description="The fabric cluster UUID that names the NVLink domain (one NVL72 rack).")
    state: str = Field(
        description="healthy; degraded (one tray's fabric fails: it is left out of `usable_nodes`); failed (the "
        "switch side: an open domain incident, its trays cordoned, no node usable)"
    )
    healthy: bool
    summary: str = Field(description="Why it is not healthy; empty when it is.")
    nodes: list[DomainNodeOut]
    cliques: list[CliqueOut]
    usable_nodes: list[str] = Field(
        description="Nodes a scheduler may place one tensor-parallel group across: in service, fabric registered."
    )
    shared_incident_id: int | None = Field(description="The open domain incident (a shared-cause incident), if any.")


class DomainPage(BaseModel):
    model_config = {"json_schema_extra": {"examples": [{"items": [_EXAMPLE]}]}}

    items: list[DomainOut]
