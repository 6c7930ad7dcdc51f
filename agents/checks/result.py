"""The typed result every check returns, and the few ways to make one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "not_available"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict on one subject (the node, or one GPU `gpu:N`, or one port `ib:mlx5_0/1`).

    `measured` and `expected` are figures in `unit` where the check has one; a performance figure the agent cannot
    judge alone (GEMM TFLOPS) passes here against the spec floor and is judged again by the service against the
    fleet (ml/check_criteria.py).
    """

    check: str
    subject: str
    status: Status
    measured: float | None = None
    expected: float | None = None
    unit: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def not_available(check: str, why: str, *, subject: str = "node") -> CheckResult:
    return CheckResult(check, subject, "not_available", evidence={"reason": why})
