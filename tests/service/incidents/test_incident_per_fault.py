"""One incident per fault on the real database: a machine's fault is its own incident (job, root cause, machine),
decided and resolved on its own, however many faults the long-running job went through before."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml import findings as ml_findings
from service.config import get_settings
from service.decisions.lifecycle import acknowledge
from service.incidents.service import resolve_quiet, resolve_recovered
from service.models import Decision, Finding, Incident, Job, LogEvent, Node
from tests import rows
from tests.decide import decide, finding

# The database's clock: a pass reads the findings stored in the last hour by their insertion time.
T0 = datetime.now(UTC).replace(microsecond=0)


def _xid(node: str, at: datetime) -> list:
    return [finding(node, detector="xid", category="gpu_hardware", at=at, key=f"xid79-{node}-{at:%H%M%S}")]


def _incidents(session: Session, job: Job) -> list[Incident]:
    return list(session.scalars(select(Incident).where(Incident.job_id == job.id).order_by(Incident.id)))


def _user_bug(nodes: Sequence[str | None]) -> list[ml_findings.Finding]:
    """The same traceback on every node's ranks (None: the job's own finding), asking to roll back."""
    return [
        finding(
            n, detector="tracebacks", category="user_code", at=T0, key=f"bug-{n}", blame="user_code", action="rollback"
        )
        for n in nodes
    ]


def _decisions(session: Session, incident: Incident) -> list[Decision]:
    return list(session.scalars(select(Decision).where(Decision.incident_id == incident.id)))


def _done(session: Session, decision: Decision, at: datetime) -> None:
    """A scheduler carried it out."""
    acknowledge(
        session, decision_id=decision.id, outcome="done", message="done", actor="test", now=at, settings=get_settings()
    )


def _evicted(session: Session, job: Job, node: str, *, done_after_s: float) -> Incident:
    """The node's GPU lost at T0, and the node evicted `done_after_s` later: its resolved incident."""
    decide(session, job, _xid(node, T0), T0)
    (incident,) = _incidents(session, job)
    (evict,) = _decisions(session, incident)
    _done(session, evict, T0 + timedelta(seconds=done_after_s))
    return incident


def test_a_second_machines_fault_while_the_first_is_open_is_its_own_incident_and_decision(session: Session) -> None:
    job = rows.job(session)
    a, b = rows.node(session).name, rows.node(session).name
    decide(session, job, _xid(a, T0), T0)
    # The first fault's eviction waits on a scheduler; meanwhile another machine loses a GPU.
    later = T0 + timedelta(minutes=3)
    decide(session, job, _xid(b, later), later)
    first, second = _incidents(session, job)
    assert (first.root_cause, first.anchor) == ("gpu_hardware", a)
    assert (second.root_cause, second.anchor) == ("gpu_hardware", b)
    assert [d.kind for d in _decisions(session, first)] == ["evict"]
    assert [d.kind for d in _decisions(session, second)] == ["evict"]


def test_the_same_kind_of_fault_again_after_its_incident_resolved_opens_a_new_one(session: Session) -> None:
    job = rows.job(session)
    a = rows.node(session).name
    first = _evicted(session, job, a, done_after_s=30)
    assert first.state == "resolved"
    back = T0 + timedelta(minutes=40)  # repaired, back in the job, and failing again
    decide(session, job, _xid(a, back), back)
    _, second = _incidents(session, job)
    assert second.anchor == a and second.state != "resolved"
    held = session.scalars(select(Finding.observed_at).where(Finding.incident_id == second.id)).all()
    assert held == [back], "the new fault's evidence only; the resolved fault's stays with its incident"


def test_link_errors_on_a_failed_gpu_after_its_incident_resolved_open_nothing(session: Session) -> None:
    job = rows.job(session)
    a = rows.node(session).name
    first = _evicted(session, job, a, done_after_s=20)
    # The dead GPU's PCIe replays, still rising after the eviction (the node leaves the job's window a little
    # later): the failure's symptom, not a new fault.
    after = T0 + timedelta(minutes=1)
    replays = finding(
        a, detector="counters", category="pcie", at=after - timedelta(seconds=5), key="replays", action="diagnose",
        confidence=0.7,
    )  # fmt: skip
    decide(session, job, [replays], after)
    assert [i.id for i in _incidents(session, job)] == [first.id]
    (stored,) = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.category == "pcie"))
    assert stored.incident_id is None


def test_a_job_wide_cause_stays_one_incident_and_a_stall_joins_the_machine_that_explains_it(session: Session) -> None:
    job = rows.job(session)
    nodes = [rows.node(session).name for _ in range(3)]
    decide(session, job, _user_bug(nodes), T0)
    (user,) = _incidents(session, job)
    assert (user.root_cause, user.anchor) == ("user_code", "")
    # Later a GPU is lost and the job hangs: the hang is that machine's fault's consequence, in its incident.
    later = T0 + timedelta(minutes=10)
    hang = finding(None, detector="progress", category="hang", at=later, key="hang", action="diagnose", confidence=0.9)
    decide(session, job, [*_xid(nodes[1], later), hang], later)
    machine = [i for i in _incidents(session, job) if i.root_cause == "gpu_hardware"]
    assert [i.anchor for i in machine] == [nodes[1]]
    held = set(session.scalars(select(Finding.detector).where(Finding.incident_id == machine[0].id)))
    assert held == {"xid", "progress"}


def _step(session: Session, job: Job, node: str, at: datetime) -> None:
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    session.add(
        LogEvent(
            batch_id=uuid.uuid4(), node_id=node_id, job_id=job.id, ts=at, source="training", kind="step",
            line=f"step 100 at {at:%H:%M:%S}", rank=0,
        )
    )  # fmt: skip
    session.flush()


def test_a_user_bug_resolves_once_the_relaunched_job_trains_again_and_its_rollback_is_moot(session: Session) -> None:
    job = rows.job(session)
    nodes = [rows.node(session).name for _ in range(2)]
    bug = _user_bug([*nodes, None])  # every rank's traceback, and the job's: roll back
    xid = _xid(nodes[1], T0)
    decide(session, job, [*bug, *xid], T0)
    user = next(i for i in _incidents(session, job) if i.root_cause == "user_code")
    machine = next(i for i in _incidents(session, job) if i.root_cause == "gpu_hardware")
    (rollback,) = _decisions(session, user)
    assert (rollback.kind, rollback.state) == ("rollback", "pending")
    after = get_settings().incident_recovered_after_s
    # Still down: nothing. A step soon after the last evidence is the crash's tail, not a relaunch.
    _step(session, job, nodes[0], T0 + timedelta(seconds=after / 2))
    assert resolve_recovered(session, now=T0 + timedelta(seconds=3 * after), after_s=after) == []
    _step(session, job, nodes[0], T0 + timedelta(seconds=after + 5))
    assert resolve_recovered(session, now=T0 + timedelta(seconds=3 * after), after_s=after) == [user.id]
    assert user.state == "resolved" and user.resolution.startswith("recovered")
    assert (rollback.state, rollback.outcome_message) == ("expired", "moot: the job trains again")
    # A machine's fault is not over because the job trains around it: it waits for its eviction.
    assert machine.state != "resolved"


def test_late_evidence_of_a_fault_already_dealt_with_joins_its_incident_and_accuses_nobody(session: Session) -> None:
    """The DCGM counters' rise is read a pass after the Xid line that got the node evicted: it is the same fault's
    evidence; a new incident with it accused the machine again once it was back from repair."""
    job = rows.job(session)
    a = rows.node(session).name
    first = _evicted(session, job, a, done_after_s=2)
    counter = finding(
        a, detector="counters", category="gpu_hardware", at=T0 - timedelta(seconds=5), key="dbe",
        summary="uncorrectable ECC errors +1",
    )  # fmt: skip
    later = T0 + timedelta(seconds=15)
    result = decide(session, job, [counter], later)
    assert result.decisions == [] and [i.id for i in _incidents(session, job)] == [first.id]
    assert first.state == "resolved"
    (stored,) = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "counters"))
    assert stored.incident_id == first.id
    # The same machine's new fault, observed after its repair, is a new incident.
    back = T0 + timedelta(minutes=40)
    decide(session, job, _xid(a, back), back)
    assert len(_incidents(session, job)) == 2


def test_quiet_resolution_for_some_jobs_leaves_the_others_alone(session: Session) -> None:
    """The campaign's processes keep their own simulated clocks: one resolved the other's incidents early."""
    mine, theirs = rows.job(session), rows.job(session)
    a, b = rows.node(session).name, rows.node(session).name
    decide(session, mine, _xid(a, T0), T0)
    decide(session, theirs, _xid(b, T0), T0)
    for decision in session.scalars(select(Decision).where(Decision.job_id.in_([mine.id, theirs.id]))):
        decision.state = "rejected"
    session.flush()
    quiet_s = get_settings().incident_quiet_resolve_s
    later = T0 + timedelta(seconds=quiet_s + 5)
    (own,) = _incidents(session, mine)
    assert resolve_quiet(session, now=later, quiet_s=quiet_s, job_ids=[mine.id]) == [own.id]
    (other,) = _incidents(session, theirs)
    assert other.state != "resolved"


def test_failing_check_results_of_a_node_a_job_wide_incident_evicted_are_that_incidents(session: Session) -> None:
    """NaN loss on one node -> diagnose -> its checks fail -> evicted: the failing checks' findings, stored as
    the node's own, opened an incident of their own that evicted the node again once it was back from repair."""
    job = rows.job(session)
    node = rows.node(session)
    a = node.name
    nan = finding(a, detector="training_metrics", category="nan", at=T0, key="nan", action="diagnose", confidence=0.8)
    decide(session, job, [nan], T0)
    (incident,) = _incidents(session, job)
    (diagnose,) = _decisions(session, incident)
    _done(session, diagnose, T0 + timedelta(seconds=5))
    evicted_at = T0 + timedelta(seconds=90)
    evict = rows.decision(session, incident=incident, node=node, kind="evict", state="pending")  # the checks' verdict
    _done(session, evict, evicted_at)
    assert incident.state == "resolved"
    check = finding(
        a, detector="checks", category="gpu_hardware", at=evicted_at - timedelta(seconds=2), key="numerics",
        summary="check numerics failed",
    )  # fmt: skip
    result = decide(session, job, [check], evicted_at + timedelta(seconds=10))
    assert result.decisions == [] and [i.id for i in _incidents(session, job)] == [incident.id]


def _stall(at: datetime, key: str, **evidence: str) -> ml_findings.Finding:
    """The job's hang finding, observed when its timeout ran out."""
    return finding(
        None, detector="progress", category="hang", at=at, key=key, action="diagnose", confidence=0.9,
        evidence={"hang_timeout_s": 90, **evidence},
    )  # fmt: skip


def test_the_jobs_stall_through_an_evicted_machines_restart_is_that_faults_not_a_new_incident(
    session: Session,
) -> None:
    """The job stops stepping when a GPU is lost; the machine is evicted in seconds, but the restart on a spare
    takes longer than the hang timeout: the stall began before the remedy, so it is the lost GPU's incident's (it
    opened a hang incident of its own, merged a pass later: an extra incident and chat message per fault). A stall
    of the restarted job (its processes came up after the remedy) is a new incident."""
    job = rows.job(session)
    a = rows.node(session).name
    first = _evicted(session, job, a, done_after_s=5)
    last_step = (T0 - timedelta(seconds=1)).isoformat()
    result = decide(
        session,
        job,
        [_stall(T0 + timedelta(seconds=89), "restart", last_step_at=last_step)],
        T0 + timedelta(seconds=95),
    )
    assert result.decisions == [] and [i.id for i in _incidents(session, job)] == [first.id]
    (stall,) = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "progress"))
    assert stall.incident_id == first.id and first.state == "resolved"
    restarted = (T0 + timedelta(seconds=60)).isoformat()
    later = T0 + timedelta(seconds=160)
    decide(session, job, [_stall(later, "new", last_step_at=last_step, restarted_at=restarted)], later)
    incidents = _incidents(session, job)
    assert len(incidents) == 2 and incidents[1].root_cause == "hang" and incidents[1].state != "resolved"


def test_failing_checks_of_a_diagnose_decision_stay_in_its_incident_and_settle_its_blame(session: Session) -> None:
    """A NaN loss on one node (blame unknown) -> diagnose -> a check fails: the check's finding joins the NaN
    incident, which now blames the machine; later passes neither regroup it into a second incident (a hardware
    incident anchored on the node, merged away a pass later) nor set the blame back to unknown."""
    job = rows.job(session)
    node = rows.node(session)
    nan = finding(
        node.name, detector="training_metrics", category="nan", at=T0, key="nan", action="diagnose", confidence=0.8,
        blame="unknown",
    )  # fmt: skip
    decide(session, job, [nan], T0)
    (incident,) = _incidents(session, job)
    assert incident.blame == "unknown"
    # Where service/checks/loop.py puts a diagnose decision's failed check: its job and incident.
    failed = Finding(
        dedup_key=f"stop_checks:{uuid.uuid4()}", job_id=job.id, node_id=node.id, incident_id=incident.id,
        detector="stop_checks", category="gpu_hardware", subject_kind="gpu", subject=f"{node.name}/0",
        confidence=0.95, summary="check numerics failed", blame="infrastructure", role="cause", action="evict",
        evidence={}, observed_at=T0 + timedelta(seconds=50),
    )  # fmt: skip
    session.add(failed)
    session.flush()
    decide(session, job, [], T0 + timedelta(seconds=60))
    assert [i.id for i in _incidents(session, job)] == [incident.id]
    assert session.get(Finding, failed.id).incident_id == incident.id and incident.blame == "infrastructure"


def test_a_nan_run_read_again_after_its_incident_recovered_joins_it(session: Session) -> None:
    """Every NaN-loss fault in the campaign made two incidents: the first resolved once the relaunched job trained
    again, then a pass read the same run's steps (logged before the relaunch) as new findings and opened a second
    one, left open past its fault. Evidence from before the job got over it is the resolved incident's; a NaN after
    the relaunch is a new incident."""
    job = rows.job(session)
    nodes = [rows.node(session).name for _ in range(2)]

    def nan(at: datetime, key: str) -> ml_findings.Finding:
        return finding(None, detector="training_metrics", category="nan", at=at, key=key, action="rollback")

    decide(session, job, [nan(T0, "nan-527")], T0)
    (first,) = _incidents(session, job)
    after = get_settings().incident_recovered_after_s
    _step(session, job, nodes[0], T0 + timedelta(seconds=after + 5))
    assert resolve_recovered(session, now=T0 + timedelta(seconds=3 * after), after_s=after) == [first.id]
    later = T0 + timedelta(seconds=3 * after + 10)
    result = decide(session, job, [nan(T0 + timedelta(seconds=60), "nan-540")], later)
    assert result.incidents == [] and [i.id for i in _incidents(session, job)] == [first.id]
    again = T0 + timedelta(seconds=4 * after)
    decide(session, job, [nan(again, "nan-900")], again)
    assert len(_incidents(session, job)) == 2


def test_a_stall_that_began_while_a_drained_machine_was_checked_is_a_new_incident(session: Session) -> None:
    """The machine was drained for its checks (diagnose done) and the job restarted without it; a rank then hung in
    a checkpoint before the checks evicted the machine: that hang began after the machine left, so it is no late
    evidence of the machine's fault (the campaign missed a hang in a checkpoint so)."""
    job = rows.job(session)
    node = rows.node(session)
    nan = finding(node.name, detector="training_metrics", category="nan", at=T0, key="nan", action="diagnose",
                  confidence=0.8)  # fmt: skip
    decide(session, job, [nan], T0)
    (incident,) = _incidents(session, job)
    (diagnose,) = _decisions(session, incident)
    _done(session, diagnose, T0 + timedelta(seconds=5))
    evict = rows.decision(session, incident=incident, node=node, kind="evict", state="pending")  # the checks' verdict
    _done(session, evict, T0 + timedelta(seconds=120))
    assert incident.state == "resolved"
    hang_began = (T0 + timedelta(seconds=80)).isoformat()
    later = T0 + timedelta(seconds=180)
    decide(session, job, [_stall(later, "ckpt", last_step_at=hang_began)], later)
    incidents = _incidents(session, job)
    assert len(incidents) == 2 and incidents[1].root_cause == "hang"


def test_a_launcher_summary_of_a_user_bug_read_after_its_incident_recovered_joins_it(session: Session) -> None:
    """The 200-fault campaign: every rank crashed on a user's bug; the incident resolved once the relaunched job
    trained again, and only then did a pass store torchrun's failure summary from the crash. It opened an incident
    of its own, of unknown blame (a manual intervention). It is the bug's; a launcher failure later is new."""
    job = rows.job(session)
    nodes = [rows.node(session).name for _ in range(2)]
    decide(session, job, _user_bug([*nodes, None]), T0)
    (user,) = _incidents(session, job)
    after = get_settings().incident_recovered_after_s
    _step(session, job, nodes[0], T0 + timedelta(seconds=after + 5))
    assert resolve_recovered(session, now=T0 + timedelta(seconds=3 * after), after_s=after) == [user.id]

    def launcher(at: datetime) -> ml_findings.Finding:
        return finding(None, detector="signatures", category="job_failure", at=at, key=f"launcher-{at:%H%M%S}")

    crash = launcher(T0 + timedelta(seconds=30))
    result = decide(session, job, [crash], T0 + timedelta(seconds=3 * after + 10))
    assert result.incidents == [] and [i.id for i in _incidents(session, job)] == [user.id]
    assert session.scalars(select(Finding.incident_id).where(Finding.dedup_key.endswith(crash.key))).one() == user.id
    again = T0 + timedelta(seconds=6 * after)
    decide(session, job, [launcher(again)], again)
    assert len(_incidents(session, job)) == 2
