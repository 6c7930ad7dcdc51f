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


class DirectiveOut(BaseModel):
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
    directive: DirectiveOut
    nodes_reporting: int
    dumps: list[StackDumpOut]
