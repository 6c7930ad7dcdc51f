"""A split diagnosis pass through real Celery workers (a chord over Redis, two worker processes sharing nothing but
PostgreSQL and Redis) stores the findings and peer state a single in-process pass stores for the same data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings
from service.diagnosis import metric_passes, service, split, state, tasks
from service.models import Finding, Job
from service.worker import celery_app
from tests.procs import running
from tests.service.diagnosis.test_diagnosis_windows import _load, _straggler

pytestmark = pytest.mark.slow


def _findings(session: Session, job: Job) -> list[tuple[Any, ...]]:
    rows = session.scalars(select(Finding).where(Finding.job_id == job.id)).all()
    return sorted((r.detector, r.category, _plain(r.subject, job), r.confidence, _plain(r.summary, job)) for r in rows)


def _plain(text: str, job: Job) -> str:
    """Without the job's suffix on its node names (each copy of the simulated job has its own nodes)."""
    for name in set(_straggler().job.rank_nodes.values()):
        text = text.replace(f"{name}-{job.id}", name)
    return text


def _peer_state(session: Session, job: Job) -> str:
    kept = state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION)[1]
    return _plain(json.dumps(kept, sort_keys=True), job)


def test_a_chord_over_two_workers_matches_a_single_pass(committed: Engine, tmp_path: Any) -> None:
    factory = sessionmaker(bind=committed)
    run = _straggler()
    node, gpu, injected = run.fault()
    with factory(expire_on_commit=False) as session:
        split_job, single_job = _load(session, run), _load(session, run)
        session.commit()
    settings = get_settings()
    env = {"FAULTLINE_DIAGNOSIS_SPLIT_GROUP_GPUS": "8"}  # one node a group: 4 group tasks over 2 workers
    argv = ["faultline", "work", "--queues", "diagnosis", "--concurrency", "1"]
    with running(argv, env=env, log=tmp_path / "w1.log"), running(argv, env=env, log=tmp_path / "w2.log"):
        t = injected
        while t <= injected + 180:
            now = run.at(t).isoformat()
            sent = tasks.diagnose_job.apply_async(
                args=[split_job.external_id], kwargs={"now": now, "split": True}, ignore_result=False
            )
            report = sent.get(timeout=120)
            assert report["split"] == 4
            merged = celery_app.AsyncResult(report["merge_id"]).get(timeout=120)
            assert len(merged["groups_s"]) == 4
            with factory() as session:
                service.diagnose_job(session, job_id=single_job.external_id, settings=settings, now=run.at(t))
                session.commit()
            t += 10
    with factory() as session:
        expected = _findings(session, single_job)
        assert _findings(session, split_job) == expected
        assert _peer_state(session, split_job) == _peer_state(session, single_job)
        assert ("peers", "straggler", f"{node}/{gpu}") in {f[:3] for f in expected}
        # The merge ran to its end: the split pass is no longer in flight.
        flight = state.load(session, job_id=split_job.id, detector=split.IN_FLIGHT, version=split.IN_FLIGHT_VERSION)
        assert flight[1] == {}
