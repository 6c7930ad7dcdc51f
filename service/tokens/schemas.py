"""API tokens as admins create and list them: the plain token appears once, in the creation response."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.models.auth import SCOPES
from service.types import HorizonTime, NodeName

Scope = Literal[SCOPES]  # type: ignore[valid-type]
TokenState = Literal["active", "expired", "revoked"]
# A year-scale cap catches a TTL given in milliseconds by mistake; longer-lived tokens simply have none.
MAX_TTL_S = 10 * 366 * 86_400
# A node name with the shell wildcards * ? [ ] (fnmatch): gpu-*, gpu-0[0-4]?
NodePattern = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9*?\[\]!._-]+$")]


class EnrolmentIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"node_name": "gpu-node-017"}]})

    node_name: NodeName = Field(description="The node the new agent token will be bound to: this agent's node.")


class TokenIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"scope": "agent", "name": "agent gpu-node-017", "node_name": "gpu-node-017", "ttl_s": 7_776_000},
                {"scope": "scheduler", "name": "k8s adapter", "expires_at": "2027-06-30T00:00:00Z"},
                {"scope": "enrol", "name": "rack 1-12 agents", "node_pattern": "gpu-*", "ttl_s": 86_400},
            ]
        },
    )

    scope: Scope
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="A label for listings, e.g. who or what uses the token."
    )
    node_name: NodeName | None = Field(
        default=None, description="Agent tokens only: the token may then write that node's data and no other."
    )
    node_pattern: NodePattern | None = Field(
        default=None,
        description="Enrolment tokens only: enrol only nodes whose name matches this shell-style pattern (gpu-*).",
    )
    ttl_s: Annotated[float, Field(gt=0, le=MAX_TTL_S)] | None = Field(
        default=None, description="Expire this many seconds from now. Leave out, with `expires_at`, for no expiry."
    )
    expires_at: HorizonTime | None = Field(default=None, description="Expire at this time (with a time zone).")

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenIn:
        if self.ttl_s is not None and self.expires_at is not None:
            raise ValueError("give ttl_s or expires_at, not both")
        return self


_TOKEN_EXAMPLE = {
    "id": 7,
    "prefix": "fl_Xk3v9Qa",
    "name": "k8s adapter",
    "scope": "scheduler",
    "node_name": None,
    "node_pattern": None,
    "created_at": "2026-11-22T10:00:00Z",
    "expires_at": "2027-06-30T00:00:00Z",
    "revoked_at": None,
    "state": "active",
}


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_TOKEN_EXAMPLE]})

    id: int
    prefix: str = Field(description="The token's first characters, to tell tokens apart; never the token.")
    name: str | None
    scope: str
    node_name: str | None
    node_pattern: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    state: TokenState


class TokenCreated(TokenOut):
    """A new token: the only response that ever carries the plain token."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{**_TOKEN_EXAMPLE, "token": "fl_Xk3v9QaLr0bT5m2J8yWcPz1nHdE6uGfA4sKq7VtY0iM"}]}
    )

    token: str = Field(description="The bearer token. Shown only here: store it now.")


class TokenPage(BaseModel):
    """A page of tokens, newest first (the web UI's listing: one agent token per node adds up)."""

    items: list[TokenOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null at the end.")
