"""A decision a person rejected makes its findings wrong in the calibration table; a scheduler's refusal does not."""

from __future__ import annotations

from typing import Any

from lab.evaluation import calibration
from lab.evaluation.records import GroundTruth


def _decision(state: str, actor: str, finding_ids: list[int]) -> dict[str, Any]:
    return {"state": state, "actor": actor, "evidence": {"findings": [{"id": i} for i in finding_ids]}}


def test_a_persons_reject_counts_its_findings_wrong() -> None:
    truth = GroundTruth.from_json(
        {
            "scenario": "nvlink",
            "job_id": "job-1",
            "nodes": ["node-000", "node-001"],
            "faults": [{"kind": "nvlink", "nodes": ["node-001"], "injected_at": "2026-11-26T12:00:00+00:00"}],
        }
    )
    findings = [
        {"id": 1, "detector": "counters", "confidence": 0.8, "node": "node-001"},
        {"id": 2, "detector": "peers", "confidence": 0.9, "node": "node-001"},
        {"id": 3, "detector": "peers", "confidence": 0.9, "node": "node-001"},
    ]
    incidents = [
        {
            "findings": findings,
            "decisions": [
                _decision("rejected", "operator:ana", [2]),
                _decision("rejected", "scheduler:slurm", [3]),
                _decision("done", "scheduler:slurm", [1]),
            ],
        }
    ]
    judged = calibration.judge(truth, incidents)
    assert [(j.detector, j.right) for j in judged] == [("counters", True), ("peers", False), ("peers", True)]
    bins = {(b.detector, b.low): b for b in calibration.reliability(judged)}
    assert (bins[("peers", 0.9)].findings, bins[("peers", 0.9)].accuracy) == (2, 0.5)
