"""A stop-time check result as an agent ships it in a batch's `checks` (agents/checks/result.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.types import NodeName, PlausibleTime

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class CheckResultIn(BaseModel):
    """One stop-time check result (agents/checks/result.py), or a suite's refusal (`refused`, no `check`)."""

    model_config = ConfigDict(extra="ignore")  # as every ingest item: a newer agent's extra fields are dropped

    ts: PlausibleTime
    directive_id: str | None = Field(default=None, max_length=200)
    check: str | None = Field(default=None, min_length=1, max_length=100, examples=["gemm_bf16"])
    subject: str = Field(default="node", min_length=1, max_length=128, examples=["gpu:3", "ib:mlx5_0/1"])
    status: Literal["pass", "fail", "not_available"] | None = None
    refused: str | None = Field(default=None, max_length=2000, description="Why the suite did not run.")
    measured: FiniteFloat | None = None
    expected: FiniteFloat | None = None
    unit: str | None = Field(default=None, max_length=32)
    duration_s: Annotated[float, Field(ge=0, le=86_400)] | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _result_or_refusal(self) -> CheckResultIn:
        if (self.refused is None) == (self.status is None):
            raise ValueError("a check item has either a status (and a check) or `refused`, not both")
        if self.status is not None and self.check is None:
            raise ValueError("a check result names its check")
        return self


class RunChecksRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: Annotated[int, Field(ge=1, le=3)] = Field(default=2, description="1 seconds, 2 minutes, 3 long.")
    force: bool = Field(default=False, description="Run even while the node runs a job's ranks (they would suffer).")
    peer: NodeName | None = Field(
        default=None,
        description="A known-good node for the cross-node all-reduce (level 3); its agent runs that check alone.",
    )
    return_on_pass: bool = Field(
        default=False,
        description="The repair gate: return the node to service when every check passes (it stays out otherwise).",
    )
    reason: str | None = Field(default=None, max_length=1000, examples=["diagnose: GPU 3 less busy than its peers"])
    ttl_s: Annotated[int, Field(ge=10, le=3600)] = Field(
        default=600, description="The agent receives the request if it reports within this many seconds."
    )

    @model_validator(mode="after")
    def _peer_needs_level_3(self) -> RunChecksRequest:
        if self.peer is not None and self.level != 3:
            raise ValueError("a peer is for the cross-node all-reduce, which runs at level 3")
        return self


class NodeDirectiveOut(BaseModel):
    id: uuid.UUID
    node: str
    kind: str
    params: dict[str, Any]
    reason: str | None
    requested_by: str
    created_at: datetime
    expires_at: datetime


_DIRECTIVE_EXAMPLE = {
    "id": "3c1f2a4e-5b6d-4e7f-8a9b-0c1d2e3f4a5b",
    "node": "gpu-node-017",
    "kind": "run_checks",
    "params": {"level": 2, "force": False},
    "reason": "diagnose: GPU 3 less busy than its peers",
    "requested_by": "alice",
    "created_at": "2026-11-26T22:40:00Z",
    "expires_at": "2026-11-26T22:50:00Z",
}


class RunChecksOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"directives": [_DIRECTIVE_EXAMPLE]}]})

    directives: list[NodeDirectiveOut] = Field(description="The node's, then its peer's, if one was named.")


class CheckResultOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    directive_id: str | None
    ts: datetime
    check: str
    subject: str
    gpu_model: str | None
    status: str = Field(description="The agent's: pass, fail, not_available, or refused (the suite did not run).")
    verdict: str = Field(description="The service's, after judging a figure against the fleet (or the spec floor).")
    basis: str = Field(description="What the verdict rests on: fleet, spec or agent.")
    measured: float | None
    expected: float | None
    cutoff: float | None
    unit: str | None
    duration_s: float | None
    evidence: dict[str, Any]
    finding_id: int | None


class CheckResultsOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "node": "gpu-node-017",
                    "results": [
                        {
                            "id": 41,
                            "directive_id": _DIRECTIVE_EXAMPLE["id"],
                            "ts": "2026-11-26T22:41:30Z",
                            "check": "gemm_bf16",
                            "subject": "gpu:3",
                            "gpu_model": "NVIDIA H100 80GB HBM3",
                            "status": "pass",
                            "verdict": "fail",
                            "basis": "fleet",
                            "measured": 638.0,
                            "expected": None,
                            "cutoff": 717.8,
                            "unit": "TFLOPS",
                            "duration_s": 0.4,
                            "evidence": {"fleet": {"history": 4096, "median": 797.5, "shortfall": 0.2}},
                            "finding_id": 977,
                        }
                    ],
                }
            ]
        }
    )

    node: str
    results: list[CheckResultOut]
