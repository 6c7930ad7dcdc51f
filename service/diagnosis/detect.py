"""Run every `ml/` detector over one job's signals; a detector that fails is logged and skipped, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import pandas as pd

from ml import alerts, counters, failslow, peers, progress, signatures, training_metrics
from ml.findings import Finding, JobInfo, LogRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobSignals:
    job: JobInfo
    steps: list[LogRecord]
    events: list[LogRecord]
    metrics: pd.DataFrame
    processes: pd.DataFrame
    now: datetime


@lru_cache(maxsize=1)
def _classifier() -> Callable[[list[str]], list[tuple[str, float]]] | None:
    """The shipped log classifier, loaded once per process; without it rules still work."""
    try:
        from ml.classifier import default_classifier

        return default_classifier().predict
    except Exception:
        log.exception("log classifier unavailable; lines no rule knows stay unclassified")
        return None


def run_all(signals: JobSignals) -> list[Finding]:
    s = signals
    detectors: list[tuple[str, Callable[[], list[Finding]]]] = [
        ("signatures", lambda: signatures.detect(s.job, s.events, classify=_classifier())),
        ("alerts", lambda: alerts.detect(s.job, s.events, classify=_classifier())),
        ("training_metrics", lambda: training_metrics.detect(s.job, s.steps + s.events)),
        ("counters", lambda: counters.detect(s.job, s.metrics, now=s.now)),
        ("peers", lambda: peers.detect(s.job, s.metrics, now=s.now)),
        (
            "progress",
            lambda: progress.detect(s.job, steps=s.steps, processes=s.processes, metrics=s.metrics, now=s.now),
        ),
        ("failslow", lambda: failslow.detect(s.job, steps=s.steps, processes=s.processes, now=s.now)),
    ]
    findings: list[Finding] = []
    for name, run in detectors:
        try:
            findings.extend(run())
        except Exception:
            # One broken detector must not blind the others.
            log.exception("detector %s failed on job %s", name, s.job.job_id)
    return findings
