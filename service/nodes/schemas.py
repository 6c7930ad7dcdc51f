"""Nodes as schedulers and people see them: state, GPUs, incidents and history across jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.pagination import page_config


class NodeOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "name": "gpu-node-017",
                    "state": "evicted",
                    "state_reason": "Xid 79 (GPU has fallen off the bus) on GPU 3",
                    "state_changed_at": "2026-11-22T10:00:04Z",
                    "lemon": False,
                    "quarantined_until": "2026-11-22T11:00:04Z",
                    "work_before_gate_at": None,
                    "last_seen_at": "2026-11-22T10:00:02Z",
                    "current_job": "llm-pretrain-42",
                    "gpus": 8,
                }
            ]
        },
    )

    name: str
    state: str = Field(
        description="healthy, suspect, cordoned, evicted, in_repair, or returning (back in service, its return gate "
        "running: the stop-time checks)"
    )
    state_reason: str | None
    state_changed_at: datetime
    lemon: bool = Field(description="A suspect in several different jobs: quarantined longer, needs diagnostics.")
    quarantined_until: datetime | None = Field(description="A return to service before this is refused.")
    work_before_gate_at: datetime | None = Field(
        default=None,
        description="A scheduler placed work on it while it was out of service, before its return gate passed "
        "(null otherwise): it is `returning`, its gate running.",
    )
    last_seen_at: datetime | None
    current_job: str | None
    gpus: int
    nvlink_domain: str | None = Field(
        default=None,
        description="The NVLink domain its GPUs are in (the fabric cluster UUID; GB200 NVL72: its rack); "
        "GET /api/v1/nvlink-domains/{uuid} says whether it is healthy.",
    )
    nvlink_clique: str | None = Field(default=None, description="Its GPUs' NVLink clique within the domain.")


class NodePage(BaseModel):
    model_config = page_config(NodeOut)

    items: list[NodeOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null at the end.")


class GpuOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    index: int
    uuid: str | None
    model: str | None
    pci_bus_id: str | None
    last_seen_at: datetime | None
    fabric_cluster_uuid: str | None = Field(default=None, description="Its NVLink domain (NVML fabric info).")
    fabric_clique_id: int | None = None
    fabric_state: str | None = Field(default=None, description="not_started, in_progress or completed.")
    fabric_health: str | None = Field(default=None, description="healthy, unhealthy or limited_capacity.")
    fabric_degraded_bw: bool | None = None


class NodeIncidentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: str
    state: str
    root_cause: str
    blame: str
    confidence: float = Field(description="How strongly this incident accuses this node.")
    opened_at: datetime


class NodeEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    at: datetime
    kind: str = Field(
        description="e.g. suspect, lemon, cordon, evict_done, evict_failed, repair, return, return_reported, "
        "placed_before_gate, gate_passed, gate_failed, cleared"
    )
    from_state: str | None
    to_state: str | None
    actor: str
    source: str = Field(
        description="What moved it: diagnosis, decision_ack (a scheduler's acknowledgement), scheduler (it reported "
        "the node schedulable again), placement (a job put work on it), person, checks (its return gate)"
    )
    reason: str | None
    job_id: str | None
    incident_id: int | None
    decision_id: int | None
    details: dict[str, Any] | None


class EvictionOut(BaseModel):
    """The node's latest eviction: what the state shows while it is out."""

    model_config = ConfigDict(from_attributes=True)

    at: datetime
    reason: str | None
    gpus: list[int] = Field(description="The GPUs the eviction was about (empty when it named none).")
    job_id: str | None
    incident_id: int | None
    decision_id: int | None


class NodeDetail(NodeOut):
    last_eviction: EvictionOut | None = Field(description="Its latest eviction carried out, if any.")
    gpu_list: list[GpuOut]
    open_incidents: list[NodeIncidentOut]
    history: list[NodeEventOut] = Field(description="Newest first, across jobs.")
    jobs: list[str] = Field(description="Jobs that ran ranks here, most recent first.")


class CordonIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "fans failing, ticket HW-4411"}]}
    )

    reason: str = Field(min_length=1, max_length=1000)


class Diagnostics(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"passed": True, "tool": "dcgmi diag -r 3", "report": "all tests passed", "ran_at": None}]
        }
    )

    passed: bool
    tool: str = Field(min_length=1, max_length=200, description="What ran, e.g. `dcgmi diag -r 3`.")
    report: str | None = Field(default=None, max_length=20_000)
    ran_at: datetime | None = None


class ReturnIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "reason": "GPU 3 replaced",
                    "diagnostics": {"passed": True, "tool": "dcgmi diag -r 3", "report": "all tests passed"},
                }
            ]
        },
    )

    reason: str = Field(min_length=1, max_length=1000)
    diagnostics: Diagnostics | None = Field(
        default=None, description="Required for a lemon, or for every node if the service is set so."
    )
    force: bool = Field(default=False, description="Return before the quarantine ends; recorded in the history.")


class LadderStepOut(BaseModel):
    """One remedy on a node's escalation ladder."""

    decision_id: int | None
    kind: str = Field(description="The decision's kind: restart, reset_gpu or evict.")
    rung: str = Field(description="restart, reset_gpu, reboot, repair or rma.")
    rung_number: int = Field(description="1 (restart) to 5 (rma).")
    at: datetime = Field(description="When it was decided.")
    family: str = Field(description="The root cause it was for (gpu_hardware, nvlink, ...).")
    state: str
    held: bool | None = Field(
        description="False: the node faulted again with the same family within the hold time; true: it did not; "
        "null: too early to tell."
    )
    failed_at: datetime | None = Field(description="The fault that showed it did not hold.")
    outcome: str
    reason: str | None


class LadderOut(BaseModel):
    """A node's escalation ladder: restart -> reset_gpu -> reboot -> repair -> rma."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "node": "gpu-node-017",
                    "rung": "reboot",
                    "rung_number": 3,
                    "rungs": ["restart", "reset_gpu", "reboot", "repair", "rma"],
                    "steps": [
                        {
                            "decision_id": 41,
                            "kind": "reset_gpu",
                            "rung": "reset_gpu",
                            "rung_number": 2,
                            "at": "2026-11-29T08:00:00Z",
                            "family": "gpu_hardware",
                            "state": "done",
                            "held": False,
                            "failed_at": "2026-11-29T10:00:00Z",
                            "outcome": "done",
                            "reason": "reset GPU 3 on gpu-node-017: Xid 119 (GSP RPC timeout)",
                        }
                    ],
                    "rma_at": None,
                    "rma_reason": None,
                    "thresholds": {
                        "hold_s": 86400.0,
                        "settle_s": 120.0,
                        "fatal_count": 3.0,
                        "fatal_window_s": 86400.0,
                        "rma_count": 4.0,
                        "rma_window_s": 604800.0,
                    },
                }
            ]
        }
    )

    node: str
    rung: str | None = Field(description="Its last remedy's rung, until that one held (then null: the foot).")
    rung_number: int | None
    rungs: list[str]
    steps: list[LadderStepOut] = Field(description="Its remedies within the ladder's reach, oldest first.")
    rma_at: datetime | None = Field(description="When it went out for a vendor replacement (RMA), if it did.")
    rma_reason: str | None
    thresholds: dict[str, float]
