"""Incidents as the API shows them: root cause, blame, suspects, and the findings and decisions behind them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.decisions.schemas import DecisionOut
from service.pagination import page_config


class SuspectOut(BaseModel):
    # Read from the incident's JSON list of dicts, not from a row.
    node: str
    confidence: float
    action: str = Field(description="The strongest action a finding about this node asks for.")
    reason: str
    finding_ids: list[int]


class FindingOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    detector: str
    category: str
    subject_kind: str
    subject: str
    node: str | None
    confidence: float
    blame: str
    role: str = Field(description="`cause` explains the incident; `symptom` (a victim's timeout) corroborates it.")
    action: str
    summary: str
    evidence: dict[str, Any]
    observed_at: datetime
    created_at: datetime


class AcknowledgementOut(BaseModel):
    # Read from the incident's JSON list of dicts, not from a row.
    actor: str = Field(description="Who said they are on it: `operator:<token name>`, or the proxy's user.")
    at: datetime
    note: str | None = None


class IncidentOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "id": 7,
                    "job_id": "llm-pretrain-42",
                    "state": "mitigating",
                    "root_cause": "gpu_hardware",
                    "anchor": "gpu-node-017",
                    "blame": "infrastructure",
                    "severity": "critical",
                    "confidence": 0.97,
                    "summary": "Xid 79 (GPU has fallen off the bus) on gpu-node-017 GPU 3",
                    "suspects": [
                        {
                            "node": "gpu-node-017",
                            "confidence": 0.97,
                            "action": "evict",
                            "reason": "Xid 79 (GPU has fallen off the bus) on GPU 3",
                            "finding_ids": [41],
                        }
                    ],
                    "opened_at": "2026-11-22T10:00:03Z",
                    "updated_at": "2026-11-22T10:00:03Z",
                    "resolved_at": None,
                    "resolution": None,
                    "resolved_by": None,
                    "acknowledged_by": "operator:oncall-ana",
                    "acknowledged_at": "2026-11-22T10:01:12Z",
                    "acknowledgements": [
                        {"actor": "operator:oncall-ana", "at": "2026-11-22T10:01:12Z", "note": "looking at node 017"}
                    ],
                    "silence_id": None,
                    "findings": [],
                    "decisions": [],
                }
            ]
        },
    )

    id: int
    job_id: str
    state: str
    root_cause: str
    anchor: str = Field(
        default="", description="The machine a machine fault's incident is about; empty for a job-wide incident."
    )
    blame: str
    severity: str
    confidence: float
    summary: str | None
    suspects: list[SuspectOut]
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    resolution: str | None = Field(default=None, description="Why it resolved: mitigated, quiet, merged, by hand.")
    resolved_by: str | None = Field(default=None, description="Who resolved it by hand; null when it resolved itself.")
    acknowledged_by: str | None = Field(
        default=None, description="Who said they are on it (the latest to); null while nobody has."
    )
    acknowledged_at: datetime | None = Field(default=None, description="When they said so.")
    acknowledgements: list[AcknowledgementOut] = Field(
        default_factory=list, description="Every acknowledgement, oldest first: who took it, and when."
    )
    silence_id: int | None = Field(default=None, description="The maintenance window that kept it quiet.")
    findings: list[FindingOut] = Field(default_factory=list)
    decisions: list[DecisionOut] = Field(default_factory=list)


class IncidentPage(BaseModel):
    model_config = page_config(IncidentOut)

    items: list[IncidentOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null at the end.")


class ResolveIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "node-003's link replaced; job runs clean"}]}
    )

    reason: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=400)] = Field(
        description="Why a person closes it (kept with their name and the time)."
    )


class AcknowledgeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"note": "looking at node 017"}]})

    note: Annotated[str | None, StringConstraints(strip_whitespace=True, max_length=400)] = Field(
        default=None, description="What they are doing about it (optional), kept with the acknowledgement."
    )
