"""Fail-slow stack rounds in the service: a campaign that is not settled after its planned rounds gets more."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.findings import Finding, JobInfo
from service.config import Settings
from service.diagnosis import signals, stack_requests
from service.directives.service import request_stack_dump
from service.models import Directive, Job, LogEvent, Node, ProcessSnapshot, StackDump

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
WAITING = [("_engine_run_backward", "torch/autograd/graph.py"), ("backward", "torch/_tensor.py")]
COMPUTING = [("sleep", "time.py"), ("_simulate_compute", "train.py")]


def _threads(frames: list[tuple[str, str]], rank: int) -> list[dict[str, Any]]:
    """A py-spy --json thread list, innermost frame first, under a common training loop."""
    stack = [*frames, ("main", "train.py"), ("<module>", "train.py")]
    return [
        {
            "thread_id": rank,
            "thread_name": "MainThread",
            "active": True,
            "owns_gil": False,
            "frames": [{"name": n, "filename": f"/app/{f}", "line": 1, "module": None} for n, f in stack],
        }
    ]


def _answer(session: Session, job: Job, nodes: list[Node], directive: Directive, computing: set[int]) -> None:
    for rank in range(8):
        frames = COMPUTING if rank in computing else WAITING
        session.add(
            StackDump(
                batch_id=uuid.uuid4(),
                node_id=nodes[rank // 2].id,
                job_id=job.id,
                ts=directive.created_at + timedelta(seconds=1),
                rank=rank,
                pid=1000 + rank,
                directive_id=str(directive.id),
                threads=_threads(frames, rank),
            )
        )
    session.flush()


def _job(session: Session) -> tuple[Job, list[Node]]:
    """A job of 8 ranks on 4 machines (two ranks each)."""
    job = Job(external_id=f"rounds-{uuid.uuid4().hex[:6]}", world_size=8, source="agent")
    session.add(job)
    session.flush()
    nodes = [Node(name=f"{job.external_id}-n{i}") for i in range(4)]
    session.add_all(nodes)
    session.flush()
    return job, nodes


def _rounds(session: Session, job: Job) -> list[Directive]:
    query = select(Directive).where(Directive.job_id == job.id, Directive.purpose == "failslow")
    return list(session.scalars(query.order_by(Directive.round)))


def test_an_unsettled_campaign_gets_more_rounds_until_the_straggler_is_significant(session: Session) -> None:
    settings = Settings(failslow_rounds=5, failslow_max_rounds=12, failslow_round_s=5.0)
    job, nodes = _job(session)
    info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
    # Rank 3 computes in every round; the others are caught computing in about 45% of theirs.
    rng = random.Random(11)
    computing = [{r for r in range(8) if r == 3 or rng.random() < 0.45} for _ in range(12)]
    campaign = uuid.uuid4()
    for k in range(5):
        directive = stack_requests.request_round(
            session, job=job, campaign_id=campaign, round=k + 1, settings=settings, now=T0 + timedelta(seconds=5 * k)
        )
        directive.created_at = T0 + timedelta(seconds=5 * k)
        _answer(session, job, nodes, directive, computing[k])

    early = T0 + timedelta(seconds=22)
    found, wait = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=early)
    assert found == [] and wait == 3.0 and len(_rounds(session, job)) == 5  # not settled; one more is due at 25 s
    now = T0 + timedelta(seconds=26)
    found, wait = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=now)
    assert found == [] and wait == 5.0  # no "no outlier" marker, and a sixth round asked
    rounds = _rounds(session, job)
    assert [d.round for d in rounds] == [1, 2, 3, 4, 5, 6] and rounds[-1].campaign_id == campaign
    assert "extra round 6 (up to 12)" in (rounds[-1].reason or "")

    # Before the extra round is answered nothing is concluded and nothing more is asked.
    assert stack_requests.aggregate(session, job=job, info=info, settings=settings, now=now)[0] == []
    assert len(_rounds(session, job)) == 6
    for k in range(5, 12):
        directive = _rounds(session, job)[-1]
        directive.created_at = T0 + timedelta(seconds=5 * k)
        _answer(session, job, nodes, directive, computing[k])
        now = directive.created_at + timedelta(seconds=6)
        found, _ = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=now)
        if found:
            break
    assert [(f.category, f.subject, f.action) for f in found] == [("straggler", nodes[1].name, "evict")]
    assert found[0].evidence["rounds"] == len(_rounds(session, job)) < 12


def test_a_campaign_without_a_lead_ends_after_its_planned_rounds(session: Session) -> None:
    settings = Settings(failslow_rounds=5, failslow_max_rounds=12)
    job, nodes = _job(session)
    info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
    campaign = uuid.uuid4()
    for k in range(5):
        directive = stack_requests.request_round(
            session, job=job, campaign_id=campaign, round=k + 1, settings=settings, now=T0 + timedelta(seconds=5 * k)
        )
        directive.created_at = T0 + timedelta(seconds=5 * k)
        _answer(session, job, nodes, directive, {k} if k < 2 else set())
    found, _ = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=T0 + timedelta(seconds=30))
    assert [f.summary for f in found] == ["stacks of 5 ranks show no outlier"]
    assert len(_rounds(session, job)) == 5


def test_stack_samples_of_several_requests_are_read_at_once(session: Session) -> None:
    settings = Settings()
    job, nodes = _job(session)
    campaign = uuid.uuid4()
    rounds = [
        stack_requests.request_round(
            session, job=job, campaign_id=campaign, round=k + 1, settings=settings, now=T0 + timedelta(seconds=5 * k)
        )
        for k in range(3)
    ]
    for k, directive in enumerate(rounds[:2]):
        directive.created_at = T0 + timedelta(seconds=5 * k)
        _answer(session, job, nodes, directive, {k})
    # Rank 5 dumps the first round again, later: its newest dump is the one read.
    again = StackDump(
        batch_id=uuid.uuid4(),
        node_id=nodes[2].id,
        job_id=job.id,
        ts=rounds[0].created_at + timedelta(seconds=3),
        rank=5,
        pid=1005,
        directive_id=str(rounds[0].id),
        threads=_threads(COMPUTING, 5),
    )
    session.add(again)
    session.flush()
    ids = [d.id for d in rounds]
    batched = signals.stack_samples_for(session, directive_ids=ids)
    assert list(batched) == ids and batched[ids[2]] == []
    assert all(batched[i] == signals.stack_samples_for(session, directive_ids=[i])[i] for i in ids)
    assert [s.rank for s in batched[ids[0]]] == list(range(8)) and batched[ids[0]][5].id == again.id
    assert signals.stack_samples_for(session, directive_ids=[]) == {}


def _hang_request(session: Session, job: Job, nodes: list[Node], gone: int | None) -> Directive:
    """A hang's stack request answered by 8 ranks, all waiting in the collective but `gone`, whose process had
    exited by the time its agent dumped (no threads)."""
    directive = request_stack_dump(session, job=job, requested_by="faultline", reason="suspected hang", ttl_s=60,
                                   purpose="hang")  # fmt: skip
    directive.created_at = T0
    _answer_gone(session, job, nodes, directive, gone)
    return directive


def _answer_gone(session: Session, job: Job, nodes: list[Node], directive: Directive, gone: int | None) -> None:
    _answer(session, job, nodes, directive, computing=set())
    if gone is None:
        return
    dump = session.scalar(select(StackDump).where(StackDump.directive_id == str(directive.id), StackDump.rank == gone))
    assert dump is not None
    dump.threads = []
    session.flush()


def _confirming(session: Session, first: Directive) -> Directive | None:
    return session.scalar(select(Directive).where(Directive.purpose == "hang", Directive.campaign_id == first.id))


def _judged(
    session: Session, job: Job, nodes: list[Node], info: JobInfo, first: Directive, gone: int | None
) -> list[Finding]:
    """Aggregate a hang's first look; where it names a machine, answer the confirming look with `gone` gone and
    aggregate that too. The findings of both passes."""
    found, _ = stack_requests.aggregate(
        session, job=job, info=info, settings=Settings(), now=T0 + timedelta(seconds=40)
    )
    confirm = _confirming(session, first)
    if confirm is None:
        return found
    _answer_gone(session, job, nodes, confirm, gone)
    more, _ = stack_requests.aggregate(session, job=job, info=info, settings=Settings(), now=T0 + timedelta(seconds=60))
    return found + more


def _accused(found: list[Finding]) -> set[str]:
    return {f.subject for f in found if f.subject_kind == "node"}


def _closing_signal(session: Session, job: Job, node: Node, pid: int, at: datetime) -> None:
    where = "torch/distributed/elastic/multiprocessing/api.py:897"
    line = f"W1126 04:12:45.000000 1234 {where}] Sending process {pid} closing signal SIGTERM"
    session.add(
        LogEvent(batch_id=uuid.uuid4(), node_id=node.id, job_id=job.id, ts=at, source="training", kind="elastic_error",
                 severity="warning", line=line, fields={"category": "closing_signal", "pid": pid, "signal": "SIGTERM"})
    )  # fmt: skip
    session.flush()


def test_a_rank_gone_without_a_stack_is_the_hangs_culprit(session: Session) -> None:
    job, nodes = _job(session)
    info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
    first = _hang_request(session, job, nodes, gone=5)
    found = _judged(session, job, nodes, info, first, gone=5)
    assert _accused(found) == {nodes[2].name}, [f.summary for f in found]


def test_a_hangs_stacks_accuse_a_machine_only_when_a_second_look_names_it_again(session: Session) -> None:
    """A hang persists: the first look that names a machine only asks for a second one, hang_confirm_s later; a
    rank caught in a loader hiccup just as a long checkpoint ended (a false eviction in the 24 h soak) is training
    again by then, and a second look naming another machine confirms neither."""
    job, nodes = _job(session)
    info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
    first = _hang_request(session, job, nodes, gone=5)
    settings = Settings(hang_confirm_s=10)
    early, wait = stack_requests.aggregate(
        session, job=job, info=info, settings=settings, now=T0 + timedelta(seconds=4)
    )
    assert early == [] and wait == 6 and _confirming(session, first) is None  # not yet: too soon to look again
    held, _ = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=T0 + timedelta(seconds=10))
    (holding,) = held
    assert holding.subject_kind == "job" and holding.action == "none" and "looking again" in holding.summary
    assert nodes[2].name in holding.summary
    confirm = _confirming(session, first)
    assert confirm is not None and confirm.round == 2 and confirm.created_at == T0 + timedelta(seconds=10)
    again, _ = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=T0 + timedelta(seconds=11))
    assert again == []  # the first look is done, the second not answered yet
    _answer_gone(session, job, nodes, confirm, gone=5)
    confirmed, _ = stack_requests.aggregate(
        session, job=job, info=info, settings=settings, now=T0 + timedelta(seconds=15)
    )
    assert _accused(confirmed) == {nodes[2].name}, [f.summary for f in confirmed]

    for second_look, why in ((None, "name no machine"), (1, "not the first look's machines")):
        job, nodes = _job(session)
        info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
        first = _hang_request(session, job, nodes, gone=5)
        found = _judged(session, job, nodes, info, first, gone=second_look)
        assert _accused(found) == set(), [f.summary for f in found]
        assert why in found[-1].summary, [f.summary for f in found]


def test_a_rank_its_launcher_stopped_accuses_no_machine(session: Session) -> None:
    """A restart tears the job down while the agents dump: the rank torchrun sent SIGTERM is gone for that."""
    job, nodes = _job(session)
    info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
    _hang_request(session, job, nodes, gone=5)
    _closing_signal(session, job, nodes[2], pid=1005, at=T0 + timedelta(seconds=1))
    _closing_signal(session, job, nodes[3], pid=9999, at=T0 + timedelta(seconds=1))  # another process: no matter
    found, _ = stack_requests.aggregate(
        session, job=job, info=info, settings=Settings(), now=T0 + timedelta(seconds=40)
    )
    assert not [f for f in found if f.subject_kind == "node"], [f.summary for f in found]


def _step(session: Session, job: Job, node: Node, step: int, at: datetime) -> None:
    session.add(
        LogEvent(batch_id=uuid.uuid4(), node_id=node.id, job_id=job.id, ts=at, source="training", kind="step",
                 severity="debug", line=f"step={step}", fields={"step": step})
    )  # fmt: skip
    session.flush()


def test_stacks_of_a_job_that_trained_on_after_the_request_accuse_no_one(session: Session) -> None:
    """A checkpoint longer than the hang timeout: the stall ends as the stacks are asked for; the running job's
    machines are caught at different phases of a step, which is no hang's culprit."""
    job, nodes = _job(session)
    info = JobInfo(
        job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)}, hang_timeout_s=30
    )
    first = _hang_request(session, job, nodes, gone=5)
    _step(session, job, nodes[0], 57, T0 - timedelta(seconds=31))  # the last step before the stall
    assert _accused(_judged(session, job, nodes, info, first, gone=5)) == {nodes[2].name}  # still stalled: judged
    job2, nodes2 = _job(session)
    _hang_request(session, job2, nodes2, gone=5)
    _step(session, job2, nodes2[0], 57, T0 - timedelta(seconds=31))
    _step(session, job2, nodes2[1], 58, T0 + timedelta(seconds=2))  # training went on
    info2 = JobInfo(
        job2.external_id, world_size=8, rank_nodes={r: nodes2[r // 2].name for r in range(8)}, hang_timeout_s=30
    )
    found, _ = stack_requests.aggregate(
        session, job=job2, info=info2, settings=Settings(), now=T0 + timedelta(seconds=40)
    )
    assert found == []


def _processes(session: Session, job: Job, nodes: list[Node], first_pid: int, at: datetime) -> None:
    """The agents' process reports of the job's 8 ranks (pids first_pid + rank)."""
    for rank in range(8):
        session.add(
            ProcessSnapshot(batch_id=uuid.uuid4(), node_id=nodes[rank // 2].id, job_id=job.id, ts=at,
                            pid=first_pid + rank, rank=rank, local_rank=rank % 2)
        )  # fmt: skip
    session.flush()


def test_stacks_of_processes_started_after_the_request_accuse_no_one(session: Session) -> None:
    """The job stalled waiting for a spare; the stacks were dumped once it had restarted on one, its new processes
    still loading: one rank still reading its data accused its machine (a false eviction in the campaign). The
    dumps of processes that ran when the stall was asked about are judged as before."""
    job, nodes = _job(session)
    info = JobInfo(job.external_id, world_size=8, rank_nodes={r: nodes[r // 2].name for r in range(8)})
    first = _hang_request(session, job, nodes, gone=5)
    _processes(session, job, nodes, first_pid=1000, at=T0 - timedelta(seconds=20))  # the dumps' pids: judged
    assert _accused(_judged(session, job, nodes, info, first, gone=5)) == {nodes[2].name}

    job2, nodes2 = _job(session)
    info2 = JobInfo(job2.external_id, world_size=8, rank_nodes={r: nodes2[r // 2].name for r in range(8)})
    _hang_request(session, job2, nodes2, gone=5)
    _processes(session, job2, nodes2, first_pid=2000, at=T0 - timedelta(seconds=20))  # before the restart
    found, _ = stack_requests.aggregate(
        session, job=job2, info=info2, settings=Settings(), now=T0 + timedelta(seconds=40)
    )
    assert not [f for f in found if f.subject_kind == "node"], [f.summary for f in found]
