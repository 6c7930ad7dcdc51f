"""Maintenance windows as the API takes and shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.pagination import page_config
from service.types import HorizonTime

WindowState = Literal["announced", "prepared", "in_progress", "over", "cancelled"]
CloudProvider = Literal["aws", "gcp", "azure"]
# A window longer than this is likely a unit mistake; clouds announce hours, not weeks.
MAX_WINDOW_S = 30 * 86_400


class WindowIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "starts_at": "2026-11-30T02:00:00Z",
                    "ends_at": "2026-11-30T04:00:00Z",
                    "reason": "BIOS and BMC firmware update, ticket OPS-2231",
                }
            ]
        },
    )

    starts_at: HorizonTime = Field(description="When the node goes down (ISO 8601 with a time zone).")
    ends_at: HorizonTime = Field(description="When it is expected back; after `starts_at`, in the future.")
    reason: Annotated[str, Field(min_length=1, max_length=1000)] = Field(description="Why: the work, a ticket.")


class CloudEventIn(BaseModel):
    """One scheduled event as the node's agent read it from its cloud's metadata service."""

    model_config = ConfigDict(extra="forbid")

    event_id: Annotated[str, Field(min_length=1, max_length=200)]
    starts_at: HorizonTime
    ends_at: HorizonTime = Field(
        description="When the cloud says it ends; where it gives no end, the agent adds the provider's expected length."
    )
    description: Annotated[str, Field(max_length=1000)] = ""


class CloudEventsIn(BaseModel):
    """Every scheduled event the metadata service lists now (the full set: an event no longer listed that has not
    started is cancelled)."""

    model_config = ConfigDict(extra="forbid")

    provider: CloudProvider
    events: Annotated[list[CloudEventIn], Field(max_length=100)]


_WINDOW_EXAMPLE = {
    "id": 12,
    "node": "gpu-node-017",
    "starts_at": "2026-11-30T02:00:00Z",
    "ends_at": "2026-11-30T04:00:00Z",
    "reason": "BIOS and BMC firmware update, ticket OPS-2231",
    "source": "operator",
    "external_id": None,
    "author": "operator:alice",
    "created_at": "2026-11-29T09:12:03Z",
    "state": "prepared",
    "prepared_at": "2026-11-30T01:45:00Z",
    "returned_at": None,
    "cancelled_at": None,
    "cancelled_by": None,
    "silence_id": 31,
    "checkpoint_directive_id": "0b6f1c2e-8d4a-4f7b-9c3e-5a1d2e3f4b6c",
}


class WindowOut(BaseModel):
    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_WINDOW_EXAMPLE]})

    id: int
    node: str
    starts_at: datetime
    ends_at: datetime
    reason: str
    source: str = Field(description="`operator`, or `cloud:aws` / `cloud:gcp` / `cloud:azure`.")
    external_id: str | None = Field(description="The cloud's id of the event.")
    author: str
    created_at: datetime
    state: WindowState = Field(
        description="announced (not yet within the lead time), prepared (checkpoint asked, node drained), "
        "in_progress, over (the node went to its return gate), cancelled."
    )
    prepared_at: datetime | None
    returned_at: datetime | None
    cancelled_at: datetime | None
    cancelled_by: str | None
    silence_id: int | None
    checkpoint_directive_id: str | None


class WindowPage(BaseModel):
    model_config = page_config(WindowOut)

    items: list[WindowOut]
    next_cursor: str | None = None


class CloudEventsOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "windows": [
                        _WINDOW_EXAMPLE
                        | {
                            "source": "cloud:aws",
                            "external_id": "instance-event-0d59937288b749b32",
                            "reason": "aws scheduled event instance-event-0d59937288b749b32: system-reboot",
                            "author": "agent:gpu-node-017",
                            "state": "announced",
                            "prepared_at": None,
                            "silence_id": None,
                            "checkpoint_directive_id": None,
                        }
                    ],
                    "cancelled": [],
                }
            ]
        }
    )

    windows: list[WindowOut] = Field(description="The node's windows from this provider, as recorded now.")
    cancelled: list[int] = Field(description="Windows of this provider the cloud no longer lists, cancelled now.")
