"""Ingest's trigger: a critical event asks for the events fast pass, a stack answer for a full pass, each
debounced per job in the real Redis. Ingest picks the jobs out of its batch; the trigger gets their ids."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from service.diagnosis import tasks
from service.diagnosis.trigger import DiagnosisTrigger
from service.ingest.handoff import jobs_with_critical_events, jobs_with_stack_answers
from service.ingest.schemas import IngestBatch


def _batch(
    *, logs: Sequence[dict[str, Any]] = (), stacks: Sequence[dict[str, Any]] = (), job: str | None = "j1"
) -> IngestBatch:
    now = datetime.now(UTC).isoformat()
    return IngestBatch.model_validate(
        {
            "batch_id": str(uuid.uuid4()),
            "node": "node-1",
            "sent_at": now,
            "job_id": job,
            "logs": [{"ts": now, "source": "kmsg", "line": "x", **e} for e in logs],
            "stacks": [{"ts": now, "pid": 7, **s} for s in stacks],
        }
    )


def test_critical_events_and_stack_answers_name_their_jobs() -> None:
    batch = _batch(
        logs=[
            {"kind": "xid"},
            {"kind": "step"},
            {"kind": "nccl_warn", "severity": "critical", "job_id": "j2"},
            {"kind": "nccl_warn", "job_id": "j3"},
        ],
        stacks=[{"directive_id": "d1", "job_id": "j4"}, {"job_id": "j5"}],
    )
    assert jobs_with_critical_events(batch) == {"j1", "j2"}
    assert jobs_with_critical_events(batch, needing_steps=True) == set()
    nan = _batch(logs=[{"kind": "nan_loss", "severity": "critical"}])
    # A NaN is judged against the other nodes' step lines, which only a full pass reads.
    assert jobs_with_critical_events(nan) == set() and jobs_with_critical_events(nan, needing_steps=True) == {"j1"}
    assert jobs_with_stack_answers(batch) == {"j4"}  # an unasked dump is no answer
    assert jobs_with_critical_events(_batch(logs=[{"kind": "xid"}], job=None)) == set()  # no job to diagnose


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """What the trigger enqueues, per task (the broker itself is the worker tests' business)."""
    calls: dict[str, list[str]] = {"events": [], "full": []}
    monkeypatch.setattr(tasks.diagnose_events, "apply_async", lambda args, **_: calls["events"].append(args[0]))
    monkeypatch.setattr(tasks.diagnose_job, "apply_async", lambda args, **_: calls["full"].append(args[0]))
    return calls


def test_the_trigger_sends_each_kind_of_pass_once_per_burst(sent: dict[str, list[str]]) -> None:
    trigger = DiagnosisTrigger(os.environ["FAULTLINE_REDIS_URL"])
    job = f"job-{uuid.uuid4().hex[:6]}"
    for _ in range(3):  # a burst: many nodes report the same failure within the debounce interval
        trigger.fire({job})
    trigger.fire({job}, full=True)
    assert sent == {"events": [job], "full": [job]}
