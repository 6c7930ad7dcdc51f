"""Which jobs of a batch diagnosis must look at now: ingest reads the batch, the trigger gets job ids."""

from __future__ import annotations

from service.diagnosis.trigger import NEEDS_STEPS, is_critical
from service.ingest.schemas import IngestBatch


def _default_job(batch: IngestBatch) -> str | None:
    return batch.job_id or next((p.job_id for p in batch.processes if p.job_id), None)


def jobs_with_critical_events(batch: IngestBatch, *, needing_steps: bool = False) -> set[str]:
    """External ids of the jobs this batch carries a critical event of: with `needing_steps`, only those
    whose event must be judged against the job's step lines (a NaN on one node while the others report
    finite values is that node's GPU, not the user's code), which the events-only fast pass does not read."""
    default = _default_job(batch)
    jobs = {
        e.job_id or default
        for e in batch.logs
        if is_critical(e.kind, e.severity) and (e.kind in NEEDS_STEPS) == needing_steps
    }
    return {job for job in jobs if job}


def jobs_with_stack_answers(batch: IngestBatch) -> set[str]:
    """External ids of the jobs this batch answers a stack request of."""
    default = _default_job(batch)
    return {job for job in (s.job_id or default for s in batch.stacks if s.directive_id) if job}
