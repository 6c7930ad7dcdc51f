"""A stop-time check result as an agent ships it in a batch's `checks` (agents/checks/result.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.types import PlausibleTime

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
