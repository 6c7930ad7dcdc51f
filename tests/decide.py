"""Findings as a detector would report them, through the service's store/demarcate/decide step (no detectors)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ml.findings import Finding
from service.config import Settings, get_settings
from service.diagnosis.service import DiagnosisResult, _decide
from service.models import Job


def finding(node: str | None, *, detector: str, category: str, at: datetime, key: str, **values: Any) -> Finding:
    """A machine's finding (a job-level one for node None) asking to evict it, unless `values` say otherwise."""
    defaults: dict[str, Any] = {
        "subject_kind": "node" if node else "job",
        "subject": node or "job",
        "confidence": 0.95,
        "summary": f"{category} on {node or 'the job'}",
        "blame": "infrastructure" if node else "unknown",
        "action": "evict" if node else "none",
    }
    return Finding(detector=detector, category=category, observed_at=at, node=node, key=key, **(defaults | values))


def decide(
    session: Session, job: Job, findings: list[Finding], now: datetime, settings: Settings | None = None
) -> DiagnosisResult:
    """One pass's decide step over these findings, at `now` (under the environment's settings unless given)."""
    result = DiagnosisResult(job_id=job.external_id)
    _decide(session, job=job, findings=findings, result=result, settings=settings or get_settings(), now=now)
    return result
