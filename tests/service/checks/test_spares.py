"""Idle spares checked on a schedule with a budget (service/checks/spares.py), against the real database; and the
beat task through a real Celery worker's task function."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from service.checks import spares
from service.config import get_settings
from service.models import CheckResult, Directive, Node, Rank
from tests import rows

NOW = datetime.now(UTC)


@pytest.fixture(autouse=True)
def _now() -> None:
    """Each test's own now: a module-level one would age while the tests before it run."""
    global NOW
    NOW = datetime.now(UTC)


def _settings(**kw: object):
    return get_settings().model_copy(update={"checks_spare_interval_s": 3600.0, "checks_spare_max_concurrent": 2, **kw})


def _node(session, name: str, *, seen_s: float = 10.0, state: str = "healthy") -> Node:
    return rows.node(session, name, state=state, last_seen_at=NOW - timedelta(seconds=seen_s))


def _checked(session, node: Node, *, ago_s: float, directive_id: str | None = None) -> None:
    session.add(
        CheckResult(
            node_id=node.id, batch_id=uuid.uuid4(), directive_id=directive_id, ts=NOW - timedelta(seconds=ago_s),
            check="nvml_state", subject="gpu:0", status="pass", verdict="pass", basis="agent", evidence={},
        )
    )  # fmt: skip
    session.flush()


def _sent(session) -> dict[str, Directive]:
    out = session.execute(
        select(Node.name, Directive).join(Node, Node.id == Directive.node_id).where(Directive.kind == "run_checks")
    ).all()
    return {name: d for name, d in out}


def test_only_idle_spares_in_service_that_report_and_are_due_get_level_1_checks(session) -> None:
    job = rows.job(session)
    busy = _node(session, "sp-busy")
    session.add(Rank(job_id=job.id, rank=0, node_id=busy.id, local_rank=0, gpu_index=0))
    finished = rows.job(session)
    finished.state = "finished"
    idle_after_job = _node(session, "sp-after-job")  # a rank of a finished job: idle again
    session.add(Rank(job_id=finished.id, rank=0, node_id=idle_after_job.id, local_rank=0, gpu_index=0))
    _node(session, "sp-never")  # never checked: first
    recent = _node(session, "sp-recent")
    _checked(session, recent, ago_s=600)  # checked 10 min ago: not due
    _node(session, "sp-silent", seen_s=3600)  # its agent is gone: nobody would answer
    _node(session, "sp-suspect", state="suspect")
    _node(session, "sp-evicted", state="evicted")
    _node(session, "sp-returning", state="returning")  # its return gate is its check
    old = _node(session, "sp-old", state="healthy")
    _checked(session, old, ago_s=7200)
    session.flush()
    sent = spares.check_idle_spares(session, now=NOW, settings=_settings(checks_spare_max_concurrent=5))
    assert sent == ["sp-after-job", "sp-never", "sp-old"]  # never checked first, then the oldest
    directives = _sent(session)
    assert set(directives) == set(sent)
    d = directives["sp-old"]
    assert d.params == {"level": 1, "force": False} and d.requested_by == spares.ACTOR
    assert d.expires_at <= NOW + timedelta(seconds=spares.TTL_S + 5)
    # A second beat: each already has its checks pending; nothing is sent twice.
    assert spares.check_idle_spares(session, now=NOW, settings=_settings(checks_spare_max_concurrent=5)) == []


def test_at_most_the_budget_runs_at_once_and_an_answer_frees_a_slot(session) -> None:
    for i in range(5):
        _node(session, f"sp-{i}")
    settings = _settings(checks_spare_max_concurrent=2)
    assert spares.check_idle_spares(session, now=NOW, settings=settings) == ["sp-0", "sp-1"]
    assert spares.in_flight(session, now=NOW) == 2
    assert spares.check_idle_spares(session, now=NOW, settings=settings) == []  # the budget is spent
    answered = _sent(session)["sp-0"]
    _checked(session, session.scalar(select(Node).where(Node.name == "sp-0")), ago_s=0, directive_id=str(answered.id))
    assert spares.in_flight(session, now=NOW) == 1
    assert spares.check_idle_spares(session, now=NOW, settings=settings) == ["sp-2"]
    # An unanswered directive that expired no longer holds a slot.
    assert spares.in_flight(session, now=NOW + timedelta(seconds=spares.TTL_S + 1)) == 0


def test_an_interval_of_zero_turns_the_schedule_off(session) -> None:
    _node(session, "sp-off")
    assert spares.check_idle_spares(session, now=NOW, settings=_settings(checks_spare_interval_s=0.0)) == []
    assert _sent(session) == {}


def test_the_beat_schedules_the_task_and_the_worker_knows_it() -> None:
    from service.worker import celery_app

    entry = celery_app.conf.beat_schedule["check-idle-spares"]
    assert entry["task"] == "maintenance.check_idle_spares"
    celery_app.loader.import_default_modules()
    assert "maintenance.check_idle_spares" in celery_app.tasks
