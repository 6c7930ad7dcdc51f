"""Incidents as the API shows them: root cause, blame, suspects, and the findings and decisions behind them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from service.decisions.schemas import DecisionOut


class SuspectOut(BaseModel):
    node: str
    confidence: float
    action: str = Field(description="The strongest action a finding about this node asks for.")
    reason: str
    finding_ids: list[int]


class FindingOut(BaseModel):
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


class IncidentOut(BaseModel):
    id: int
    job_id: str
    state: str
    root_cause: str
    blame: str
    severity: str
    confidence: float
    summary: str | None
    suspects: list[SuspectOut]
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    resolution: str | None = Field(default=None, description="Why it resolved: mitigated, quiet, merged, by hand.")
    silence_id: int | None = Field(default=None, description="The maintenance window that kept it quiet.")
    findings: list[FindingOut] = Field(default_factory=list)
    decisions: list[DecisionOut] = Field(default_factory=list)


class IncidentPage(BaseModel):
    items: list[IncidentOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null at the end.")
