"""A diagnosis pass split across workers (service/diagnosis/split.py): group tasks' parts, merged, give exactly
the findings and detector state a single pass gives on the same data."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml import peer_spans
from service.config import get_settings
from service.diagnosis import metric_passes, service, signals, split, state
from service.models import Finding, Job
from tests.service.diagnosis.test_diagnosis_windows import _load, _straggler


def _findings(session: Session, job: Job) -> list[tuple[Any, ...]]:
    rows = session.scalars(select(Finding).where(Finding.job_id == job.id).order_by(Finding.dedup_key)).all()
    return [(r.dedup_key, r.detector, r.subject, r.category, r.confidence, r.summary, r.evidence) for r in rows]


def _peer_state(session: Session, job: Job) -> dict[str, Any]:
    return state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION)[1]


def test_a_split_pass_finds_exactly_what_a_single_pass_finds(session: Session) -> None:
    run = _straggler()
    node, gpu, injected = run.fault()
    job = _load(session, run)
    # One node (8 GPUs) a group: 4 group tasks, the smallest groups a job can have.
    settings = get_settings().model_copy(update={"diagnosis_split_group_gpus": 8})
    t = injected - 60
    compared = 0
    while t <= injected + 200:
        now = run.at(t)
        # The single pass, from the same state, then undone.
        single = session.begin_nested()
        service.diagnose_job(session, job_id=job.external_id, settings=settings, now=now)
        expected, expected_state = _findings(session, job), _peer_state(session, job)
        single.rollback()
        # The split pass: plan, one task per node group (through JSON, as the result backend carries it), merge.
        planned = split.plan(session, job_id=job.external_id, settings=settings, now=now, split=True)
        assert planned is not None and not planned.skipped and len(planned.groups) == 4
        results = [
            json.loads(json.dumps(split.group_parts(session, job_id=job.external_id, node_ids=g, ends=planned.ends)))
            for g in planned.groups
        ]
        parts = split.merged_parts(results)
        assert sorted(parts) == sorted(planned.ends) and len(parts) <= split.GROUP_SPANS_MAX
        info = signals.job_info(session, job=job)
        # Every span is judged from the parts (none falls back to reading the whole job's windows).
        assert all(peer_spans.judge_span(info, p) is not None for p in parts.values())
        service.diagnose_job(session, job_id=job.external_id, settings=settings, now=planned.now, peer_parts=parts)
        split.finish(session, job_id=job.external_id, now=planned.now)
        assert _findings(session, job) == expected
        assert _peer_state(session, job) == expected_state
        compared += 1
        t += 5
    # Not vacuous: the straggler was found, by both.
    subjects = {f[2] for f in _findings(session, job) if f[1] == "peers"}
    assert subjects == {f"{node}-{job.id}/{gpu}"} and compared > 40


def test_small_jobs_keep_the_single_pass_and_a_split_in_flight_holds_the_periodic_pass(session: Session) -> None:
    run = _straggler()
    job = _load(session, run)
    settings = get_settings()
    assert settings.diagnosis_split_min_gpus > 32  # the 32-GPU job is small
    assert split.plan(session, job_id=job.external_id, settings=settings, now=run.at(100)) is None
    forced = settings.model_copy(update={"diagnosis_split_min_gpus": 32, "diagnosis_split_group_gpus": 16})
    planned = split.plan(session, job_id=job.external_id, settings=forced, now=run.at(100))
    assert planned is not None and len(planned.groups) == 2 and not planned.skipped
    # While that one is in flight a periodic pass skips; once merged, the next one plans again.
    again = split.plan(session, job_id=job.external_id, settings=forced, now=run.at(105), skip_if_busy=True)
    assert again is not None and again.skipped
    split.finish(session, job_id=job.external_id, now=run.at(105))
    after = split.plan(session, job_id=job.external_id, settings=forced, now=run.at(105), skip_if_busy=True)
    assert after is not None and not after.skipped
