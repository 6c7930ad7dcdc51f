"""Job registration: world size, parallelism and where each rank runs."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Annotated

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from service.types import INT32_MAX, JobId, NodeName

DIMENSIONS = ("tp", "pp", "dp")


class Parallelism(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tp: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    pp: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    dp: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    order: str = Field(
        default="tp-dp-pp",
        description="Dimensions from fastest- to slowest-varying along the global rank (Megatron: tp-dp-pp).",
        json_schema_extra={"enum": ["-".join(p) for p in itertools.permutations(("tp", "dp", "pp"))]},
    )

    @model_validator(mode="after")
    def _order_is_permutation(self) -> Parallelism:
        if sorted(self.order.split("-")) != sorted(DIMENSIONS):
            raise ValueError(f"order must name tp, pp and dp once each, separated by '-', got {self.order!r}")
        return self


class RankPlacement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: Annotated[int, Field(ge=0, le=INT32_MAX)]
    node: NodeName
    local_rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    gpu: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class JobIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "job_id": "llm-pretrain-42",
                    "world_size": 16,
                    "parallelism": {"tp": 4, "pp": 2, "dp": 2, "order": "tp-dp-pp"},
                    "hang_timeout_s": 300,
                    "ranks": [{"rank": 0, "node": "gpu-node-001", "local_rank": 0}],
                }
            ]
        },
    )

    job_id: JobId
    world_size: Annotated[int, Field(ge=1, le=1_000_000)]
    parallelism: Parallelism | None = None
    hang_timeout_s: Annotated[int, Field(ge=5, le=86_400)] = 600
    ranks: list[RankPlacement] | None = Field(
        default=None, description="Optional rank-to-node map; agents report it too."
    )

    @model_validator(mode="after")
    def _consistent(self) -> JobIn:
        p = self.parallelism
        if p is not None and p.tp * p.pp * p.dp != self.world_size:
            raise ValueError(
                f"tp*pp*dp = {p.tp}*{p.pp}*{p.dp} = {p.tp * p.pp * p.dp} must equal world_size {self.world_size}"
            )
        if self.ranks:
            seen: set[int] = set()
            for placement in self.ranks:
                if placement.rank >= self.world_size:
                    raise ValueError(f"rank {placement.rank} is outside world_size {self.world_size}")
                if placement.rank in seen:
                    raise ValueError(f"rank {placement.rank} is placed twice")
                seen.add(placement.rank)
        return self


class RankOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    # Read from a row of (Rank.rank, Node.name, Rank.local_rank, Rank.gpu_index, Rank.pid); the field's own name
    # comes first so a dict (FastAPI re-validates its answers) still reads by it.
    rank: int
    node: str = Field(validation_alias=AliasChoices("node", "name"))
    local_rank: int | None
    gpu: int | None = Field(validation_alias=AliasChoices("gpu", "gpu_index"))
    pid: int | None


class JobOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "job_id": "llm-pretrain-42",
                    "world_size": 16,
                    "parallelism": {"tp": 4, "pp": 2, "dp": 2, "order": "tp-dp-pp"},
                    "hang_timeout_s": 300,
                    "state": "running",
                    "source": "registered",
                    "created_at": "2026-11-22T09:00:00Z",
                    "updated_at": "2026-11-22T09:00:00Z",
                    "last_seen_at": "2026-11-22T10:00:01Z",
                    "nodes": ["gpu-node-001", "gpu-node-002"],
                    "ranks": [{"rank": 0, "node": "gpu-node-001", "local_rank": 0, "gpu": 0, "pid": 4242}],
                }
            ]
        },
    )

    # A Job row holds it as external_id; "job_id" first, as for RankOut.
    job_id: str = Field(validation_alias=AliasChoices("job_id", "external_id"))
    world_size: int | None
    parallelism: Parallelism | None
    hang_timeout_s: int
    state: str
    source: str = Field(description="`registered` through this API, or `agent` when first seen in agent data.")
    created_at: datetime
    updated_at: datetime
    last_seen_at: datetime | None
    nodes: list[str]
    ranks: list[RankOut]
