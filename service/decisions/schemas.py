"""Decisions as schedulers and people read them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.pagination import page_config


class DecisionOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "id": 12,
                    "incident_id": 7,
                    "job_id": "llm-pretrain-42",
                    "node": "gpu-node-017",
                    "kind": "evict",
                    "gpu": None,
                    "gpu_pci": None,
                    "state": "pending",
                    "confidence": 0.97,
                    "reason": "evict gpu-node-017: Xid 79 (GPU has fallen off the bus) on gpu-node-017 GPU 3",
                    "evidence": {"incident_id": 7, "root_cause": "gpu_hardware", "findings": [{"id": 41}]},
                    "created_at": "2026-11-22T10:00:03Z",
                    "expires_at": "2026-11-22T10:30:03Z",
                }
            ]
        },
    )

    id: int
    incident_id: int | None = Field(description="Null for an operator's cordon or a return to service.")
    job_id: str | None = Field(description="The job's external id; null for node decisions outside a job.")
    node: str | None
    kind: str = Field(
        description="evict, cordon, return, reset_gpu (node, and `gpu` or `gpu_pci`), diagnose (node); restart, "
        "rollback, none."
    )
    gpu: int | None = Field(
        default=None,
        description="For reset_gpu: the index of the GPU to reset on `node` (as nvidia-smi numbers "
        "it); null when the node's GPU inventory does not know it (then `gpu_pci` names the GPU), and for every "
        "other kind.",
    )
    gpu_pci: str | None = Field(
        default=None,
        description="For reset_gpu when `gpu` is null (a node whose agent reports no GPU inventory: no NVML, "
        "kernel log only): the GPU's PCI bus id, domain:bus:device.function in lower case, as `nvidia-smi -r -i` "
        "accepts it in place of an index; null for every other decision.",
        examples=["0000:3b:00.0"],
    )
    state: str
    confidence: float
    reason: str
    evidence: dict[str, Any] = Field(description="The chain: incident, findings, their signals, and guard rails.")
    created_at: datetime
    expires_at: datetime | None = None
    acked_at: datetime | None = None
    outcome: str | None = None
    outcome_message: str | None = None
    actor: str | None = None
    shared_incident_id: int | None = Field(
        default=None,
        description="For a cordon decided for a shared component (a switch, a driver version...): its shared incident "
        "(GET /api/v1/shared-incidents/{id}); null otherwise.",
    )


class DecisionPage(BaseModel):
    model_config = page_config(DecisionOut)

    items: list[DecisionOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null at the end.")


class AckIn(BaseModel):
    """What the scheduler did with a decision."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"outcome": "done", "message": "cordoned and drained gpu-node-017"}]},
    )

    outcome: Literal["done", "failed", "rejected"] = Field(
        description="`done`: carried out; `failed`: tried and could not (say why); `rejected`: will not act."
    )
    message: str | None = Field(default=None, max_length=2000)


class RejectIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"message": "known flaky link, being replaced tonight"}]}
    )

    message: str | None = Field(default=None, max_length=2000, description="Why a person overruled it.")


NODE_KINDS = ("evict", "cordon", "diagnose")


class OverrideIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"kind": "evict", "node": "gpu-node-031", "message": "the ECC errors are on 031, not 017"}]
        },
    )

    kind: Literal["evict", "cordon", "diagnose", "restart", "rollback", "none"] = Field(
        description="What to do instead. evict, cordon and diagnose name a node; the others act on the job."
    )
    node: str | None = Field(default=None, max_length=253, description="The node, for evict, cordon and diagnose.")
    message: str = Field(min_length=1, max_length=2000, description="Why a person overruled the decision.")

    @model_validator(mode="after")
    def _node_matches_kind(self) -> OverrideIn:
        if self.kind in NODE_KINDS and not self.node:
            raise ValueError(f"{self.kind} needs a node")
        if self.kind not in NODE_KINDS and self.node:
            raise ValueError(f"{self.kind} acts on the job: leave node empty")
        return self
