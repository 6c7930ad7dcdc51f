"""Stack-dump requests: ask every agent of a job to dump its training processes' stacks now."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class StackDumpRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=1000, examples=["job looks hung since 10:42"])
    ttl_s: Annotated[int, Field(ge=10, le=3600)] = Field(
        default=120, description="Agents that report within this many seconds receive the request."
    )


_DIRECTIVE_EXAMPLE = {
    "id": "0b7e7c1e-3f2a-4c55-9a51-2f0d6c1b9e11",
    "job_id": "llm-pretrain-42",
    "kind": "dump_stacks",
    "reason": "job stalled for 300 s",
    "requested_by": "operator:alice",
    "created_at": "2026-11-22T10:05:00Z",
    "expires_at": "2026-11-22T10:07:00Z",
}


class DirectiveOut(BaseModel):
    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_DIRECTIVE_EXAMPLE]})

    id: uuid.UUID
    job_id: str
    kind: str
    reason: str | None
    requested_by: str
    created_at: datetime
    expires_at: datetime


class StackDumpOut(BaseModel):
    node: str
    rank: int | None
    pid: int
    ts: datetime
    error: str | None = Field(description="Why the agent could not dump this process, if it could not.")
    threads: int = Field(description="Threads in the dump.")
    frames: list[str] = Field(
        description="The stack of the thread that matters most (the main thread, else the first), innermost first."
    )


class StackDumpsOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "directive": _DIRECTIVE_EXAMPLE,
                    "nodes_reporting": 2,
                    "dumps": [
                        {
                            "node": "gpu-node-001",
                            "rank": 0,
                            "pid": 4242,
                            "ts": "2026-11-22T10:05:01Z",
                            "error": None,
                            "threads": 2,
                            "frames": ["allreduce (torch/distributed/distributed_c10d.py:2050)", "train (train.py:88)"],
                        }
                    ],
                }
            ]
        }
    )

    directive: DirectiveOut
    nodes_reporting: int
    dumps: list[StackDumpOut]
