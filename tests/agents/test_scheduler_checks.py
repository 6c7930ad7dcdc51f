"""The scheduler adapters say what a decision means for the node's stop-time checks: running (diagnose), failed
(the eviction or reset the checks made), passed (the return they made), in their log lines, Slurm's drain reason
and the Kubernetes node condition's reason."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from agents.schedulers import kubernetes
from agents.schedulers.checks import checks_state
from agents.schedulers.loop import AdapterLoop, LoopOptions
from agents.schedulers.slurm import drain_reason
from faultline.cli import build_parser

DIAGNOSE = {"id": 5, "kind": "diagnose", "node": "gpu-07", "reason": "GPU 3 slower than its peers", "evidence": {}}
FAILED = {
    "id": 6, "kind": "evict", "node": "gpu-07", "reason": "stop-time checks failed on gpu-07: gemm_bf16 gpu:3",
    "evidence": {"checks": {"directive_id": "d", "diagnose_decision": 5, "check_results": [1], "findings": [2]}},
}  # fmt: skip
PASSED = {
    "id": 7, "kind": "return", "node": "gpu-07", "reason": "return gpu-07 by faultline checks: checks passed",
    "evidence": {"manual": True, "actor": "faultline checks", "reason": "stop-time checks passed (9 checks)"},
}  # fmt: skip
PLAIN = {"id": 8, "kind": "evict", "node": "gpu-07", "reason": "Xid 79", "evidence": {"findings": []}}


@pytest.mark.parametrize(
    ("decision", "state"), [(DIAGNOSE, "running"), (FAILED, "failed"), (PASSED, "passed"), (PLAIN, None)]
)
def test_each_decision_says_where_the_checks_stand(decision: Mapping[str, Any], state: str | None) -> None:
    assert checks_state(decision) == state


def test_slurm_drain_reasons_name_the_checks() -> None:
    assert drain_reason(DIAGNOSE) == "faultline: diagnose #5: checks running: GPU 3 slower than its peers"
    assert drain_reason(FAILED).startswith("faultline: evict #6: checks failed: stop-time checks failed on gpu-07")
    assert drain_reason(PLAIN) == "faultline: evict #8: Xid 79"


def test_kubernetes_condition_reasons_for_the_checks() -> None:
    assert kubernetes._CONDITION_REASON["running"] == "FaultlineChecksRunning"
    assert kubernetes._CONDITION_REASON["failed"] == "FaultlineChecksFailed"


class _Backend:
    name = "test"

    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        self.done.append(("out", node))
        return f"drained {node}"

    def put_back(self, node: str, decision: Mapping[str, Any]) -> str:
        self.done.append(("back", node))
        return f"resumed {node}"


def test_the_adapter_loop_drains_for_a_diagnose_and_logs_the_checks(caplog: pytest.LogCaptureFixture) -> None:
    backend = _Backend()
    loop = AdapterLoop(object(), backend, LoopOptions(), stop=threading.Event())  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="agents.schedulers.loop"):
        for decision in (DIAGNOSE, FAILED, PASSED):
            loop.handle(decision)
    assert backend.done == [("out", "gpu-07"), ("out", "gpu-07"), ("back", "gpu-07")]
    lines = [r.getMessage() for r in caplog.records]
    assert "decision #5 diagnose: drained gpu-07 (stop-time checks running)" in lines
    assert "decision #6 evict: drained gpu-07 (stop-time checks failed)" in lines
    assert "decision #7 return: resumed gpu-07 (stop-time checks passed)" in lines
    assert [a[1] for a in loop.unacked] == ["done"] * 3


def test_adapters_poll_diagnose_only_when_asked() -> None:
    parser = build_parser()
    base = ["adapter", "slurm", "--url", "http://x", "--token", "t"]
    assert parser.parse_args(base).diagnose is False
    assert parser.parse_args([*base, "--diagnose"]).diagnose is True
