"""Run every `ml/` detector over one job's signals; a detector that fails is logged and skipped, never fatal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import pandas as pd
from sqlalchemy.orm import Session

from ml import alerts, failslow, progress, signatures, training_metrics
from ml.findings import Finding, JobInfo, LogRecord

log = logging.getLogger(__name__)

Detector = tuple[str, Callable[[], list[Finding]]]


@dataclass(frozen=True, slots=True)
class JobSignals:
    job: JobInfo
    steps: list[LogRecord]
    events: list[LogRecord]
    processes: pd.DataFrame
    now: datetime
    # The job's median GPU per window (progress.job_activity's shape); None when no GPU reported.
    activity: pd.DataFrame | None = None
    processes_since: datetime | None = None  # where the process snapshots read begin


@lru_cache(maxsize=1)
def _classifier() -> Callable[[list[str]], list[tuple[str, float]]] | None:
    """The shipped log classifier, loaded once per process; without it rules still work."""
    try:
        from ml.classifier import default_classifier

        return default_classifier().predict
    except Exception:
        log.exception("log classifier unavailable; lines no rule knows stay unclassified")
        return None


def warm_up() -> None:
    """Load what a process's first pass would otherwise load (the log classifier: seconds), so the first pass
    after a worker (re)start is no slower than the next."""
    _classifier()


def event_detectors(job: JobInfo, events: list[LogRecord]) -> list[Detector]:
    """The detectors that judge log events alone: all a critical event's fast pass runs."""
    return [
        ("signatures", lambda: signatures.detect(job, events, classify=_classifier())),
        ("alerts", lambda: alerts.detect(job, events, classify=_classifier())),
    ]


def run_all(
    signals: JobSignals, *, session: Session, more: Sequence[Detector] = (), timings: dict[str, float] | None = None
) -> list[Finding]:
    """Every detector on the signals, then `more` (detectors that read the database themselves); each one's
    seconds go to `timings`."""
    s = signals
    detectors: list[Detector] = [
        *event_detectors(s.job, s.events),
        ("training_metrics", lambda: training_metrics.detect(s.job, s.steps + s.events)),
        (
            "progress",
            lambda: progress.detect(
                s.job,
                steps=s.steps,
                processes=s.processes,
                metrics=None,
                activity=s.activity,
                now=s.now,
                processes_since=s.processes_since,
            ),
        ),
        ("failslow", lambda: failslow.detect(s.job, steps=s.steps, processes=s.processes, now=s.now)),
        *more,
    ]
    return run_detectors(detectors, session=session, job_id=s.job.job_id, timings=timings)


def run_detectors(
    detectors: Sequence[Detector], *, session: Session, job_id: str, timings: dict[str, float] | None = None
) -> list[Finding]:
    """Run detectors in turn; one that fails is logged and skipped."""
    findings: list[Finding] = []
    for name, run in detectors:
        started = time.perf_counter()
        try:
            # A savepoint: a detector whose query fails must not abort the pass's transaction.
            with session.begin_nested():
                findings.extend(run())
        except Exception:
            # One broken detector must not blind the others.
            log.exception("detector %s failed on job %s", name, job_id)
        if timings is not None:
            timings[name] = time.perf_counter() - started
    return findings
