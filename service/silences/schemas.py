"""Silences as operators create and read them."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.pagination import page_config
from service.types import HorizonTime

SilenceState = Literal["active", "pending", "expired"]
SILENCE_STATES: tuple[str, ...] = ("active", "pending", "expired")
# A year is a long maintenance window; more is likely a unit mistake (milliseconds for seconds).
MAX_DURATION_S = 366 * 86_400
# Node names are hostnames, so a node pattern may hold only hostname characters and shell wildcards.
_NODE_PATTERN = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]+$")


class SilenceIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"node_pattern": "gpu-node-01?", "duration_s": 7200, "comment": "PSU swap, ticket OPS-1234"},
                {
                    "job_pattern": "llm-pretrain-*",
                    "node_pattern": "gpu-node-1[0-2]*",
                    "starts_at": "2026-11-23T02:00:00Z",
                    "ends_at": "2026-11-23T06:00:00Z",
                    "author": "alice",
                    "comment": "NCCL upgrade on racks 10-12",
                },
            ]
        },
    )

    node_pattern: Annotated[str, Field(min_length=1, max_length=253)] | None = Field(
        default=None, description="Shell pattern (fnmatch, case-sensitive) on node names: `gpu-node-0[1-4]`, `rack7-*`."
    )
    job_pattern: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="Shell pattern on the job's external id. With node_pattern too, both must match."
    )
    starts_at: HorizonTime | None = Field(default=None, description="Defaults to now.")
    ends_at: HorizonTime | None = Field(default=None, description="Give this or `duration_s`.")
    duration_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S)] | None = Field(
        default=None, description="Length of the window from `starts_at`."
    )
    author: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="Defaults to the token's name, or `token #<id>`."
    )
    comment: Annotated[str, Field(max_length=2000)] = Field(default="", description="Why: a ticket, a reason.")

    @field_validator("node_pattern")
    @classmethod
    def _node_pattern(cls, value: str | None) -> str | None:
        if value is not None and not _NODE_PATTERN.match(value):
            raise ValueError(
                f"node_pattern {value!r} may contain only letters, digits, '.', '_', '-' and the wildcards * ? [ ] !"
            )
        return value

    @field_validator("job_pattern")
    @classmethod
    def _job_pattern(cls, value: str | None) -> str | None:
        if value is not None and (value != value.strip() or not value.isprintable()):
            raise ValueError(f"job_pattern {value!r} has surrounding blanks or unprintable characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SilenceIn:
        if self.node_pattern is None and self.job_pattern is None:
            raise ValueError("give node_pattern, job_pattern or both: a silence must match something")
        if (self.ends_at is None) == (self.duration_s is None):
            raise ValueError("give exactly one of ends_at and duration_s")
        return self


class SilenceOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "node_pattern": "gpu-node-01?",
                    "job_pattern": None,
                    "starts_at": "2026-11-22T10:00:00Z",
                    "ends_at": "2026-11-22T12:00:00Z",
                    "author": "alice",
                    "comment": "PSU swap, ticket OPS-1234",
                    "created_at": "2026-11-22T10:00:00Z",
                    "expired_at": None,
                    "state": "active",
                }
            ]
        },
    )

    id: int
    node_pattern: str | None
    job_pattern: str | None
    starts_at: datetime
    ends_at: datetime
    author: str
    comment: str
    created_at: datetime
    expired_at: datetime | None = Field(description="When someone ended the silence early (DELETE).")
    state: SilenceState


class SilencePage(BaseModel):
    model_config = page_config(SilenceOut)

    items: list[SilenceOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null at the end.")
