"""An eviction holds its node in cooldown only until a scheduler puts the repaired node back into a job: a new fault
on it is then decided like any other (the closed-loop demo: node-001 evicted, repaired, rejoined the job, lost a
GPU 7 minutes later, and nothing was decided)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from ml.findings import Finding
from service.config import get_settings
from service.decisions import lifecycle
from service.models import Job, Rank
from tests import rows
from tests.decide import decide, finding


def _evicted(session: Session, job: Job, fault: Finding) -> None:
    """The fault decided at its time, and the scheduler's eviction carried out 30 s later."""
    (evicted,) = decide(session, job, [fault], fault.observed_at).decisions
    lifecycle.acknowledge(
        session,
        decision_id=evicted,
        outcome="done",
        message="drained",
        actor="scheduler",
        now=fault.observed_at + timedelta(seconds=30),
        settings=get_settings(),
    )


def test_a_repaired_node_back_in_the_job_is_evicted_again_on_a_new_fault(session: Session) -> None:
    settings = get_settings()
    job, node = rows.job(session), rows.node(session)
    # Times in the recent past: the rank map's updated_at is the database's now().
    t0 = datetime.now(UTC) - timedelta(minutes=40)
    _evicted(session, job, finding(node.name, detector="signatures", category="gpu_hardware", at=t0, key="xid79-a"))

    # Out of the job: a second fault within the cooldown is not decided (the eviction's guard rail holds).
    t1 = t0 + timedelta(minutes=5)
    second = finding(node.name, detector="signatures", category="gpu_hardware", at=t1, key="xid79-b")
    assert decide(session, job, [second], t1).decisions == []

    # Repaired and given ranks again by the scheduler: the next fault is decided.
    session.add(Rank(job_id=job.id, rank=0, node_id=node.id, local_rank=0, gpu_index=0))
    session.flush()
    t2 = t0 + timedelta(minutes=20)
    third = finding(node.name, detector="signatures", category="gpu_hardware", at=t2, key="xid79-c")
    made = decide(session, job, [third], t2).decisions
    assert len(made) == 1
    assert t2 - t0 < timedelta(seconds=settings.policy_node_cooldown_s)


def test_a_repaired_node_back_in_the_job_is_no_longer_in_its_old_faults_wake(session: Session) -> None:
    """The 30-minute demo: node-000 lost a GPU and was evicted; repaired and back in the job 5 minutes later, its new
    NVLink fault (another GPU, a Xid naming it by PCI address) was taken for the lost GPU's consequence and nothing
    was decided. Before its repair, the same finding is still the lost GPU's wake."""
    job, node = rows.job(session), rows.node(session)
    t0 = datetime.now(UTC) - timedelta(minutes=10)  # the new fault comes within the old one's wake
    lost = finding(node.name, detector="signatures", category="gpu_hardware", at=t0, key="xid79", subject_kind="gpu")
    _evicted(session, job, lost)
    nvlink = {
        "detector": "signatures",
        "category": "nvlink",
        "subject_kind": "gpu",
        "subject": f"{node.name}/0000:d1:00",
    }
    t1 = t0 + timedelta(minutes=2)  # still out of the job, in repair: the lost GPU's wake
    assert decide(session, job, [finding(node.name, at=t1, key="xid74-a", **nvlink)], t1).incidents == []

    session.add(Rank(job_id=job.id, rank=0, node_id=node.id, local_rank=0, gpu_index=0))  # repaired, placed again
    session.flush()
    t2 = datetime.now(UTC)
    result = decide(session, job, [finding(node.name, at=t2, key="xid74-b", **nvlink)], t2)
    assert len(result.incidents) == 1 and len(result.decisions) == 1


def test_an_old_faults_counters_read_just_after_its_eviction_do_not_hold_the_repaired_node_in_its_wake(
    session: Session,
) -> None:
    """The 200-fault campaign's two misses: a machine's GPU 1 failed and was evicted; the DCGM counters' rise,
    sampled 0.3 s after the eviction's ack, reached the next pass. Repaired and back in the job 5 minutes later, the
    same GPU's NVLink fault was taken for that rise's wake: no incident, nothing decided until drained by hand."""
    job, node = rows.job(session), rows.node(session)
    t0 = datetime.now(UTC) - timedelta(minutes=10)
    gpu1 = {"subject_kind": "gpu", "subject": f"{node.name}/1"}
    _evicted(session, job, finding(node.name, detector="signatures", category="gpu_hardware", at=t0, key="x64", **gpu1))
    rise = t0 + timedelta(seconds=30.3)  # the ack came at t0 + 30 s
    counters = finding(node.name, detector="counters", category="gpu_hardware", at=rise, key="remap-failed", **gpu1)
    assert decide(session, job, [counters], rise + timedelta(seconds=10)).decisions == []  # the old fault's

    session.add(Rank(job_id=job.id, rank=0, node_id=node.id, local_rank=0, gpu_index=0))  # repaired, placed again
    session.flush()
    t2 = datetime.now(UTC)
    nvlink = finding(node.name, detector="counters", category="nvlink", at=t2, key="nvlink-errors", **gpu1)
    result = decide(session, job, [nvlink], t2)
    assert len(result.incidents) == 1 and len(result.decisions) == 1
