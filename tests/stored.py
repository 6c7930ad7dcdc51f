"""Checks that findings survive storage: their evidence, as JSON, reads back with its detector's shape."""

from __future__ import annotations

import json
from collections.abc import Iterable

from ml.findings import Finding, evidence_of


def check_evidence(findings: Iterable[Finding]) -> None:
    """Each finding's evidence, stored as JSON and read back, has its detector's shape (ml/evidence.py)."""
    for f in findings:
        stored = json.loads(json.dumps(f.evidence))
        assert evidence_of(f.detector, stored) is stored, (f.detector, f.key, stored)
