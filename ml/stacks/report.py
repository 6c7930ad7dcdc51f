"""Findings from a snapshot's analysis: one per suspect machine, or one for the job naming nobody."""

from __future__ import annotations

import hashlib
from datetime import datetime

from ml.findings import (
    Finding,
    JobInfo,
    SignalRef,
    StackEvidence,
    StackGroupEvidence,
    StackRoundsEvidence,
)
from ml.stacks.analysis import StackAnalysis, StackGroup
from ml.stacks.frames import _EVIDENCE_SIGNALS, MAX_TREE_DEPTH, _cap, _short_ranges, rank_ranges


def _key(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


def _groups_evidence(groups: list[StackGroup], limit: int = 20) -> list[StackGroupEvidence]:
    return [
        {
            "signature": g.signature,
            "state": g.state,
            "op": g.op,
            "ranks": _cap(g.ranks),
            "count": g.count,
            "node_count": len(g.nodes),
            "nodes": g.nodes[:10],
            "frames": g.frames[:12],
        }
        for g in groups[:limit]
    ]


def _signals(culprit_ids: list[int], outlier_ids: list[int], total: int) -> tuple[list[SignalRef], int]:
    ids = list(dict.fromkeys(culprit_ids + outlier_ids))[:_EVIDENCE_SIGNALS]
    return [{"type": "stack", "id": i} for i in ids], max(0, total - len(ids))


def findings(job: JobInfo, analysis: StackAnalysis, *, observed_at: datetime, category: str = "hang") -> list[Finding]:
    """One finding per suspect machine, or one job-level 'diagnose' finding when the stacks name nobody."""
    if not analysis.groups:
        return []
    signals, omitted = _signals(analysis.culprit_sample_ids, analysis.outlier_sample_ids, analysis.sample_ids)
    culprits = rank_ranges(analysis.culprit_ranks)
    covering = analysis.covering_group
    evidence: StackEvidence = {
        "signals": signals,
        "signals_omitted": omitted,
        "method": analysis.method,
        "why": analysis.why,
        "dominant": analysis.dominant,
        "dominant_state": analysis.dominant_state,
        "groups": _groups_evidence(analysis.groups),
        "culprit_ranks": _short_ranges(analysis.culprit_ranks) if analysis.culprit_ranks else "",
        "culprit_state": analysis.culprit_state,
        "culprit_frames": analysis.culprit_frames[:MAX_TREE_DEPTH],
        "covering_group": {"dim": covering[0], "ranks": _short_ranges(covering[1])} if covering else None,
        "ranks_reporting": analysis.ranks_reporting,
        "unreported": _cap(analysis.unreported),
        "tree": analysis.tree,
    }
    base_key = _key(category, analysis.dominant or "", culprits, analysis.method)
    if analysis.method == "inconclusive":
        suspects: list[tuple[str, float, str]] = []
    else:
        suspects = analysis.suspects
    nobody = f"stacks of {analysis.ranks_reporting} ranks name no machine: {analysis.why}"
    return _findings(job, category, base_key, suspects, evidence, observed_at, nobody=nobody)


def _findings(
    job: JobInfo,
    category: str,
    key: str,
    suspects: list[tuple[str, float, str]],
    evidence: StackEvidence | StackRoundsEvidence,
    observed_at: datetime,
    *,
    nobody: str,
) -> list[Finding]:
    """One eviction-grade finding per suspect machine, or one job-level 'diagnose' finding naming nobody."""
    if not suspects:
        return [
            Finding(
                detector="stacks",
                category=category,
                subject_kind="job",
                subject=job.job_id,
                confidence=0.3,
                summary=nobody[:300],
                observed_at=observed_at,
                blame="unknown",
                role="cause",
                action="diagnose",
                key=f"stacks:{category}:job:{key}",
                evidence=evidence,
            )
        ]
    return [
        Finding(
            detector="stacks",
            category=category,
            subject_kind="node",
            subject=node,
            confidence=confidence,
            summary=f"{node}: {why}"[:300],
            observed_at=observed_at,
            node=node,
            blame="infrastructure",
            role="cause",
            action="evict",
            key=f"stacks:{category}:{node}:{key}",
            evidence={**evidence, "why": why},
        )
        for node, confidence, why in suspects
    ]
