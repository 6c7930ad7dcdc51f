"""What a decision says about the node's stop-time checks, for the adapters' logs, drain reasons and node
conditions: a `diagnose` sends the node for its checks (running), and the service's verdict on them comes back
as an eviction or GPU reset (failed) or a return (passed) carrying the checks in its evidence
(service/checks/loop.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHECKS_ACTOR = "faultline checks"  # who the service's checks loop acts as


def checks_state(decision: Mapping[str, Any]) -> str | None:
    """running, failed, passed, or None when the decision has nothing to do with the checks."""
    kind = decision.get("kind")
    if kind == "diagnose":
        return "running"
    evidence = decision.get("evidence") or {}
    by_checks = isinstance(evidence, Mapping) and (
        isinstance(evidence.get("checks"), Mapping) or evidence.get("actor") == CHECKS_ACTOR
    )
    if not by_checks:
        return None
    if kind in ("evict", "reset_gpu", "cordon"):
        return "failed"
    return "passed" if kind == "return" else None


def note(decision: Mapping[str, Any]) -> str:
    """A suffix for a log line: " (stop-time checks running)", or nothing."""
    state = checks_state(decision)
    return f" (stop-time checks {state})" if state else ""
