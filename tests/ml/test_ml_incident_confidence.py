"""An incident's one confidence (issue 27): its top suspect's when it names machines, else its strongest
finding's; a user-code incident keeps its strongest finding's, which the rollback threshold reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ml.demarcation import demarcate, incident_confidence
from ml.findings import Finding

START = datetime(2026, 11, 27, 3, 0, tzinfo=UTC)


def _f(confidence: float, *, node: str | None, category: str = "gpu_hardware", at: float = 0, **kw: str) -> Finding:
    return Finding(
        detector=kw.pop("detector", "counters"), category=category, subject_kind="node" if node else "job",
        subject=node or "job-1", confidence=confidence, summary=f"{category} on {node}", node=node,
        observed_at=START + timedelta(seconds=at), role="cause", action=kw.pop("action", "evict"), **kw,
    )  # fmt: skip


def test_a_machine_incident_reads_its_top_suspects_confidence() -> None:
    # Two findings about one node: 0.5 and 0.25 add up (noisy-or) to 0.625 for the suspect.
    (p,) = demarcate(list(enumerate([_f(0.5, node="n1"), _f(0.25, node="n1", at=1, detector="signatures")])))
    assert [s.confidence for s in p.suspects] == [0.625]
    assert p.confidence == 0.625  # the header no longer says 50% beside a 62% suspect


def test_without_suspects_or_for_user_code_the_strongest_finding_counts() -> None:
    job_only = [_f(0.7, node=None, category="user_code", action="rollback", blame="user_code")]
    (p,) = demarcate(list(enumerate(job_only)))
    assert p.suspects == [] and p.confidence == 0.7
    user = [
        *job_only,
        _f(0.6, node="n1", category="user_code", action="none"),
        _f(0.6, node="n1", category="user_code", at=2, action="none"),
    ]
    (q,) = demarcate(list(enumerate(user)))
    assert q.blame == "user_code" and q.suspects and q.suspects[0].confidence > 0.7
    assert q.confidence == 0.7  # the rollback threshold reads the same figure as before
    assert incident_confidence([], [], "unknown") == 0.0
