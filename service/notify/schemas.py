"""Chat channels and their deliveries as the API shows them; a channel's URL is shown masked, never in full."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from service.models.notify import CHANNEL_KINDS, DELIVERY_STATES
from service.pagination import page_config

ChannelKind = Literal[CHANNEL_KINDS]  # type: ignore[valid-type]
DeliveryState = Literal[DELIVERY_STATES]  # type: ignore[valid-type]

ChannelName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\- ]*$")]
WebhookUrl = Annotated[
    str,
    Field(
        min_length=8,
        max_length=2000,
        # Checked by the service with a clearer message; stated here for clients and fuzzers.
        json_schema_extra={"pattern": "^https?://[^/?#@]+"},
        description="The webhook URL (a secret: stored, never shown again in full). Its host must be allowed "
        "by FAULTLINE_WEBHOOK_ALLOWED_HOSTS when that is set.",
    ),
]
GroupWait = Annotated[
    float,
    Field(
        ge=0,
        le=3600,
        description="Seconds an event waits for others to share its message: events of the same few seconds "
        "become one digest.",
    ),
]
RateLimit = Annotated[int, Field(ge=1, le=600, description="At most this many messages a minute; more wait.")]


class ChannelIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "gpu-oncall",
                    "kind": "slack",
                    "url": "https://hooks.slack.com/services/T0123456789/B1001010101/7IsoQTrixdUtE971O1xQTm4T",
                    "group_wait_s": 5,
                    "rate_limit_per_minute": 10,
                },
                {
                    "name": "training-infra-lark",
                    "kind": "lark",
                    "url": "https://open.larksuite.com/open-apis/bot/v2/hook/00000000-0000-0000-0000-000000000000",
                },
            ]
        },
    )

    name: ChannelName
    kind: ChannelKind = Field(description="slack (incoming webhook), lark (Lark/Feishu custom bot) or json")
    url: WebhookUrl
    enabled: bool = True
    group_wait_s: GroupWait = 5.0
    rate_limit_per_minute: RateLimit = 10


class ChannelUpdate(BaseModel):
    """Only the fields given change."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"enabled": False}, {"group_wait_s": 30}]}
    )

    # Absent means "unchanged"; null is refused, so the schema does not offer it.
    enabled: bool | SkipJsonSchema[None] = None
    url: WebhookUrl | SkipJsonSchema[None] = None
    group_wait_s: GroupWait | SkipJsonSchema[None] = None
    rate_limit_per_minute: RateLimit | SkipJsonSchema[None] = None


class ChannelOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "name": "gpu-oncall",
                    "kind": "slack",
                    "url": "https://hooks.slack.com/…Tm4T",
                    "enabled": True,
                    "group_wait_s": 5.0,
                    "rate_limit_per_minute": 10,
                    "author": "operator:alice",
                    "created_at": "2026-11-22T09:00:00Z",
                    "pending": 0,
                    "failed": 1,
                }
            ]
        },
    )

    id: int
    name: str
    kind: str
    url: str = Field(description="Masked: scheme, host and the last 4 characters.")
    enabled: bool
    group_wait_s: float
    rate_limit_per_minute: int
    author: str | None
    created_at: datetime
    pending: int = Field(description="Deliveries waiting to go out (including those being sent).")
    failed: int = Field(description="Deliveries that gave up: see /api/v1/deliveries?state=failed.")


class ChannelPage(BaseModel):
    model_config = page_config(ChannelOut)

    items: list[ChannelOut]


class ChannelTestResult(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"delivered": True, "status_code": 200, "error": None},
                {"delivered": False, "status_code": 404, "error": "HTTP 404: no_service"},
            ]
        }
    )

    delivered: bool
    status_code: int | None = Field(description="The receiver's HTTP status; null if it could not be reached.")
    error: str | None = None


class DeliveryOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "id": 41,
                    "channel_id": 3,
                    "channel": "gpu-oncall",
                    "event": "opened",
                    "event_key": "incident:7:opened",
                    "incident_id": 7,
                    "decision_id": None,
                    "state": "pending",
                    "attempts": 2,
                    "last_error": "HTTP 503: upstream unavailable",
                    "next_attempt_at": "2026-11-22T10:00:09Z",
                    "created_at": "2026-11-22T10:00:03Z",
                    "claimed_at": "2026-11-22T10:00:05Z",
                    "sent_at": None,
                    "message_key": "msg-3f1c0a9b2d7e4c6a8b0e1f2a",
                    "payload": {"event": "opened", "incident_id": 7, "job": "llm-pretrain-42"},
                }
            ]
        },
    )

    id: int
    channel_id: int
    channel: str
    event: str
    event_key: str
    incident_id: int | None
    decision_id: int | None
    state: str
    attempts: int
    last_error: str | None
    next_attempt_at: datetime = Field(description="When a pending delivery goes out (or is retried).")
    created_at: datetime
    claimed_at: datetime | None
    sent_at: datetime | None
    message_key: str | None = Field(description="Deliveries sent in one chat message share it.")
    payload: dict[str, Any] = Field(description="The snapshot the message is built from.")


class DeliveryPage(BaseModel):
    model_config = page_config(DeliveryOut)

    items: list[DeliveryOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null at the end.")
