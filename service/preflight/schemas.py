"""A preflight's outcome as `faultline preflight` posts it (agents/preflight/runner.py `as_plain`), and the answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.types import JobId, NodeName

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
MAX_NODES = 20_000


class NodeCheckIn(BaseModel):
    """One of a node's own results (agents/checks/result.py's wire form, without a time: the service stamps it)."""

    model_config = ConfigDict(extra="ignore")

    check: str = Field(min_length=1, max_length=100, examples=["gemm_bf16"])
    subject: str = Field(default="node", min_length=1, max_length=128)
    status: Literal["pass", "fail", "not_available"]
    measured: FiniteFloat | None = None
    expected: FiniteFloat | None = None
    unit: str | None = Field(default=None, max_length=32)
    duration_s: Annotated[float, Field(ge=0, le=86_400)] | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


class GroupIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    nodes: list[NodeName] = Field(min_length=1, max_length=MAX_NODES)
    verdict: Literal["pass", "fail", "unknown"]
    why: str = Field(max_length=2000)
    figures: dict[str, FiniteFloat] = Field(default_factory=dict)
    ref: NodeName | None = None


class RoundIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    index: Annotated[int, Field(ge=1, le=100_000)]
    phase: str = Field(max_length=100)
    seconds: Annotated[float, Field(ge=0, le=86_400)] | None = None
    at: str | None = Field(default=None, max_length=64, description="When the round ended (ISO 8601).")
    groups: list[GroupIn] = Field(max_length=MAX_NODES)


class NamedIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    node: NodeName
    shape: Literal["local", "slow", "pair", "unresolved"]
    why: str = Field(max_length=2000)
    peer: NodeName | None = None
    rounds: list[Annotated[int, Field(ge=1, le=100_000)]] = Field(default_factory=list, max_length=1000)


class PreflightIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "job_id": "4242",
                    "nodes": ["gpu-001", "gpu-002", "gpu-003", "gpu-004"],
                    "rounds": [
                        {
                            "index": 2,
                            "phase": "pairs",
                            "seconds": 4.1,
                            "at": "2026-11-29T00:40:02+00:00",
                            "groups": [
                                {"nodes": ["gpu-001", "gpu-002"], "verdict": "pass", "why": "ok", "figures": {}},
                                {
                                    "nodes": ["gpu-003", "gpu-004"],
                                    "verdict": "fail",
                                    "why": "slow: busbw 4.9 GB/s < 0.7 x the pairs' 47",
                                    "figures": {"busbw_gbps": 4.9, "latency_us": 210.0},
                                },
                            ],
                        }
                    ],
                    "named": [{"node": "gpu-003", "shape": "slow", "why": "slow: busbw 4.9 GB/s", "rounds": [2, 3]}],
                    "unresolved": [],
                    "measurements": 5,
                    "complete": True,
                    "seconds": 21.5,
                    "results": {"gpu-001": [{"check": "gemm_bf16", "subject": "gpu:0", "status": "pass"}]},
                }
            ]
        },
    )

    job_id: JobId
    nodes: list[NodeName] = Field(min_length=1, max_length=MAX_NODES, description="The allocation, in its order.")
    rounds: list[RoundIn] = Field(default_factory=list, max_length=10_000)
    named: list[NamedIn] = Field(default_factory=list, max_length=MAX_NODES)
    unresolved: list[NamedIn] = Field(default_factory=list, max_length=MAX_NODES)
    measurements: Annotated[int, Field(ge=0)] = 0
    complete: bool = True
    seconds: Annotated[float, Field(ge=0, le=86_400)] | None = None
    results: dict[NodeName, list[NodeCheckIn]] = Field(
        default_factory=dict, description="Each node's own check results (GEMM, local all-reduce)."
    )

    @model_validator(mode="after")
    def _nodes_of_the_allocation(self) -> PreflightIn:
        allocation = set(self.nodes)
        if len(allocation) != len(self.nodes):
            raise ValueError("a node is listed twice in `nodes`")
        strangers = (
            {n.node for n in self.named + self.unresolved} | {n.peer for n in self.named if n.peer} | set(self.results)
        ) - allocation
        if strangers:
            raise ValueError(f"not in `nodes`: {', '.join(sorted(strangers)[:5])}")
        if any(n.shape == "unresolved" for n in self.named):
            raise ValueError("an unresolved failure names nobody: it goes in `unresolved`")
        return self


class DecisionBrief(BaseModel):
    id: int
    node: str | None
    kind: str
    state: str
    reason: str


class PreflightOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "0b6c1f3e-8d2a-4f7b-9c1e-2a3b4c5d6e7f",
                    "job_id": "4242",
                    "named": ["gpu-003"],
                    "check_results": 36,
                    "incidents": [311],
                    "decisions": [
                        {
                            "id": 977,
                            "node": "gpu-003",
                            "kind": "evict",
                            "state": "pending",
                            "reason": "evict gpu-003: check preflight_network failed on gpu-003",
                        }
                    ],
                }
            ]
        }
    )

    id: str = Field(description="This preflight's id: its check results carry it as their directive_id.")
    job_id: str
    named: list[str]
    check_results: int
    incidents: list[int]
    decisions: list[DecisionBrief]


class CriterionOut(BaseModel):
    cutoff: float | None
    basis: Literal["fleet", "spec", "none"]
    history: int
    median: float | None


class CriteriaOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "NVIDIA H100 80GB HBM3",
                    "checks": {
                        "gemm_bf16": {"cutoff": 757.6, "basis": "fleet", "history": 4096, "median": 797.5},
                        "allreduce_node": {"cutoff": 225.0, "basis": "spec", "history": 12, "median": None},
                        "allreduce_peer": {"cutoff": None, "basis": "none", "history": 0, "median": None},
                    },
                }
            ]
        }
    )

    model: str
    checks: dict[str, CriterionOut] = Field(description="gemm_bf16, allreduce_node, allreduce_peer.")
