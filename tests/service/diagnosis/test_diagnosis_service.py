"""Diagnosis on the real database: agent batches in through the ingest API, incidents and decisions out.

Signals are produced by the agent's own parsers from log text in the real formats (the simulator's), so the
service sees exactly what a node would send.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training.parser import TrainingLogParser
from agents.port_watch import PortWatch
from lab.sim import logformat as fmt
from service.config import get_settings
from service.diagnosis.service import diagnose_job
from service.models import Decision, Finding, Incident, Node
from tests.conftest import bearer

NODES, GPUS = 4, 2


def _batch(node: str, job: str, logs: list[dict[str, Any]], *, rank0: int) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {
        "batch_id": str(uuid.uuid4()),
        "node": node,
        "sent_at": now,
        "job_id": job,
        "logs": logs,
        "processes": [
            {
                "ts": now,
                "pid": 1000 + r,
                "job_id": job,
                "rank": r,
                "local_rank": r - rank0,
                "world_size": NODES * GPUS,
                "cpu_pct": 50.0,
                "state": "S",
            }
            for r in range(rank0, rank0 + GPUS)
        ],
    }


def _kernel(text: str) -> list[dict[str, Any]]:
    return [e.to_wire() for e in parse_text(KernelLogParser(), text, now=datetime.now(UTC))]


def _training(lines: list[str]) -> list[dict[str, Any]]:
    return [e.to_wire() for e in parse_text(TrainingLogParser(), "\n".join(lines) + "\n", now=datetime.now(UTC))]


def _ship(client: Any, token: str, job: str, logs_by_node: dict[int, list[dict[str, Any]]]) -> None:
    for n in range(NODES):
        response = client.post(
            "/api/v1/ingest",
            json=_batch(f"node-{n}", job, logs_by_node.get(n, []), rank0=n * GPUS),
            headers=bearer(token),
        )
        assert response.status_code == 200, response.text


def _xid79(bus: int = 0x3B) -> str:
    ts = datetime.now(UTC)
    return fmt.kern(ts, fmt.xid(bus, 79, "GPU has fallen off the bus.", 4242, "python")) + "\n"


def test_fatal_xid_gives_one_incident_and_one_eviction_with_its_evidence(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, token, job, {2: _kernel(_xid79())})
    settings = get_settings()

    result = diagnose_job(session, job_id=job, settings=settings)
    assert result.new_findings >= 1
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(result.incidents))).all()
    assert (incident.root_cause, incident.blame) == ("gpu_hardware", "infrastructure")
    assert [s["node"] for s in incident.suspects] == ["node-2"]
    (decision,) = session.scalars(select(Decision).where(Decision.incident_id == incident.id)).all()
    assert (decision.kind, decision.state) == ("evict", "pending")
    chain = decision.evidence["findings"]
    assert chain and chain[0]["signals"] and chain[0]["signals"][0]["type"] == "log"

    # Idempotent: the same pass again stores and decides nothing new.
    again = diagnose_job(session, job_id=job, settings=settings)
    assert again.new_findings == 0 and again.decisions == []
    assert session.scalars(select(Decision).where(Decision.incident_id == incident.id)).all() == [decision]


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0000:81:00.0: poll_health:806:(pid 0): Fatal error 1 detected",
        "mlx5_core 0000:81:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable "
        "error, Bad or shorted cable/module",
    ],
)
def test_a_network_adapters_own_failure_evicts_its_node_at_the_first_pass(client, session, make_token, line) -> None:
    """Not a flap: the adapter or its cable failed, so the flap tolerance does not wait for a second fault."""
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, token, job, {1: _kernel(fmt.kern(datetime.now(UTC), line) + "\n")})
    result = diagnose_job(session, job_id=job, settings=get_settings())
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(result.incidents))).all()
    assert [s["node"] for s in incident.suspects] == ["node-1"] and incident.blame == "infrastructure"
    decisions = session.scalars(select(Decision).where(Decision.incident_id == incident.id)).all()
    assert [(d.kind, d.state) for d in decisions] == [("evict", "pending")]


def _flap(node: int, at: datetime, *, broke: bool) -> list[dict[str, Any]]:
    """The agent's port watch seeing node's port drop at `at` and, if `broke`, NCCL's IB completion errors of it."""
    watch, port = PortWatch(), "ib:mlx5_0/1"
    watch.changes({port: (4, 3)}, at - timedelta(seconds=1))
    wire = [e.to_wire() for e in watch.changes({port: (1, 4)}, at)]
    if broke:
        lines = fmt.nccl_ib_error(f"node-{node}", 4242, 4325, 0, "10.0.0.9", f"10.0.0.{node}", "Recv")
        text = "\n".join(lines) + "\n"
        wire += [e.to_wire() for e in parse_text(TrainingLogParser(), text, now=at + timedelta(seconds=0.4))]
    return wire


def _evictions(session: Session, result: Any) -> list[tuple[str, str]]:
    rows = session.execute(
        select(Node.name, Decision.state)
        .join(Node, Node.id == Decision.node_id)
        .where(Decision.incident_id.in_(result.incidents or [0]), Decision.kind == "evict")
    )
    return sorted((name, state) for name, state in rows)


def test_a_lone_flap_that_broke_the_jobs_connections_evicts_once_no_other_link_dropped_with_it(
    client, session, make_token
) -> None:
    """NCCL cannot carry on over a queue pair whose retries ran out: the job is interrupted already, so the flap
    tolerance does not wait for a second flap, once `policy_network_broken_flap_s` has shown no other machine's link
    dropped with it (a switch's would have)."""
    token, job, at = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}", datetime.now(UTC)
    _ship(client, token, job, {1: _flap(1, at, broke=True)})
    settings = get_settings()
    young = diagnose_job(session, job_id=job, settings=settings, now=at + timedelta(seconds=3))
    assert young.incidents and _evictions(session, young) == []  # too young to know it was alone
    settled = diagnose_job(session, job_id=job, settings=settings, now=at + timedelta(seconds=12))
    assert _evictions(session, settled) == [("node-1", "pending")]
    (evidence,) = session.scalars(
        select(Decision.evidence).where(Decision.incident_id.in_(settled.incidents), Decision.kind == "evict")
    )
    assert "broke the job's connections" in evidence["guard_rails"]["flap_tolerance"]
    # 0 turns the rule off: the same evidence waits for a second flap.
    other = f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, token, other, {1: _flap(1, at, broke=True)})
    off = settings.model_copy(update={"policy_network_broken_flap_s": 0.0})
    assert _evictions(session, diagnose_job(session, job_id=other, settings=off, now=at + timedelta(seconds=12))) == []


@pytest.mark.parametrize("case", ["rode_through", "two_machines"])
def test_a_flap_the_job_rode_through_or_one_of_several_machines_waits_for_a_second(
    client, session, make_token, case: str
) -> None:
    token, job, at = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}", datetime.now(UTC)
    if case == "rode_through":  # its port dropped, its traffic did not fail
        flaps = {1: _flap(1, at, broke=False)}
    else:  # two machines' links at once, both broken: a switch, not one machine's cable
        flaps = {1: _flap(1, at, broke=True), 2: _flap(2, at + timedelta(seconds=0.5), broke=True)}
    _ship(client, token, job, flaps)
    result = diagnose_job(session, job_id=job, settings=get_settings(), now=at + timedelta(seconds=12))
    assert result.incidents and _evictions(session, result) == []


def test_same_traceback_on_every_rank_is_user_code_and_never_evicts(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    logs = {
        n: _training([line for r in range(n * GPUS, (n + 1) * GPUS) for line in fmt.traceback_user_bug(r)])
        for n in range(NODES)
    }
    _ship(client, token, job, logs)
    result = diagnose_job(session, job_id=job, settings=get_settings())
    incidents = session.scalars(select(Incident).where(Incident.id.in_(result.incidents))).all()
    assert [(i.root_cause, i.blame) for i in incidents] == [("user_code", "user_code")]
    kinds = {d.kind for d in session.scalars(select(Decision).where(Decision.incident_id == incidents[0].id))}
    assert kinds == {"rollback"}


def test_shadow_mode_records_but_does_not_act(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, token, job, {1: _kernel(_xid79())})
    settings = get_settings().model_copy(update={"policy_mode": "shadow"})
    result = diagnose_job(session, job_id=job, settings=settings)
    states = [d.state for d in session.scalars(select(Decision).where(Decision.id.in_(result.decisions)))]
    assert states == ["shadow"]


def test_decisions_and_incidents_api(client, session, make_token) -> None:
    agent, scheduler = make_token("agent"), make_token("scheduler")
    job = f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, agent, job, {0: _kernel(_xid79(0x1A)), 3: _kernel(_xid79(0x3B))})
    diagnose_job(session, job_id=job, settings=get_settings().model_copy(update={"policy_max_evict_share_per_hour": 1}))
    session.flush()

    page = client.get("/api/v1/decisions", params={"job": job, "kind": "evict"}, headers=bearer(scheduler)).json()
    assert sorted(d["node"] for d in page["items"]) == ["node-0", "node-3"]
    one = client.get("/api/v1/decisions", params={"job": job, "limit": 1}, headers=bearer(scheduler)).json()
    assert len(one["items"]) == 1 and one["next_cursor"]
    rest = client.get(
        "/api/v1/decisions", params={"job": job, "limit": 1, "cursor": one["next_cursor"]}, headers=bearer(scheduler)
    ).json()
    assert rest["items"][0]["id"] < one["items"][0]["id"]
    by_node = client.get("/api/v1/decisions", params={"node": "node-3"}, headers=bearer(scheduler)).json()
    assert {d["node"] for d in by_node["items"]} == {"node-3"}
    assert client.get("/api/v1/decisions", params={"state": "nonsense"}, headers=bearer(scheduler)).status_code == 422
    assert client.get("/api/v1/decisions", params={"cursor": "%%%"}, headers=bearer(scheduler)).status_code == 422
    assert client.get("/api/v1/decisions").status_code == 401
    assert client.get("/api/v1/decisions", headers=bearer(agent)).status_code == 403

    # Two machines' lost GPUs are two faults: an incident each, about its machine, with its own eviction.
    incidents = [
        client.get(f"/api/v1/incidents/{d['incident_id']}", headers=bearer(scheduler)).json() for d in page["items"]
    ]
    assert len({i["id"] for i in incidents}) == 2
    for decision, incident in zip(page["items"], incidents, strict=True):
        assert incident["root_cause"] == "gpu_hardware" and incident["anchor"] == decision["node"]
        assert [d["node"] for d in incident["decisions"]] == [decision["node"]]
        assert all(f["evidence"]["signals"] for f in incident["findings"] if f["role"] == "cause")
    assert client.get("/api/v1/incidents/999999999", headers=bearer(scheduler)).status_code == 404


def test_concurrent_workers_decide_once(client, committed, make_token) -> None:
    """Two workers diagnosing the same job at the same moment: one incident, one decision."""
    job = f"job-{uuid.uuid4().hex[:6]}"
    factory = sessionmaker(bind=committed)
    with factory() as session:
        from service.tokens import service as tokens

        token = tokens.create(session, scope="agent").token
        session.commit()
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(get_settings(), factory=factory)) as real_client:
        _ship(real_client, token, job, {2: _kernel(_xid79())})
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with factory() as session:
                barrier.wait()
                diagnose_job(session, job_id=job, settings=get_settings())
                session.commit()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    with Session(committed) as session:
        assert len(session.scalars(select(Incident)).all()) == 1
        assert len(session.scalars(select(Decision)).all()) == 1
        assert len(session.scalars(select(Finding).where(Finding.detector == "signatures")).all()) >= 1
        assert all(d.created_at > datetime.now(UTC) - timedelta(minutes=5) for d in session.scalars(select(Decision)))


def _shipped_xid(committed: Any) -> str:
    """A committed job whose node-2 reported a fatal Xid, through the real ingest API; its external id."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.tokens import service as tokens

    factory = sessionmaker(bind=committed)
    with factory() as session:
        token = tokens.create(session, scope="agent").token
        session.commit()
    job = f"job-{uuid.uuid4().hex[:6]}"
    with TestClient(create_app(get_settings(), factory=factory)) as real_client:
        _ship(real_client, token, job, {2: _kernel(_xid79())})
    return job


def _hold_pass_lock(committed: Any, job: str) -> Session:
    """A session that holds the job's full-pass lock, as a long 16,384-GPU pass would, until it rolls back."""
    from service.models import Job

    holder = Session(committed)
    job_row = holder.scalar(select(Job).where(Job.external_id == job))
    assert job_row is not None
    holder.execute(text("SELECT pg_advisory_xact_lock(7401, :id)"), {"id": job_row.id})
    return holder


def test_a_periodic_pass_skips_while_a_pass_of_its_job_runs(committed) -> None:
    factory = sessionmaker(bind=committed)
    job = _shipped_xid(committed)
    holder = _hold_pass_lock(committed, job)
    try:
        with factory() as session:
            periodic = diagnose_job(session, job_id=job, settings=get_settings(), skip_if_busy=True)
            session.commit()
        assert periodic.skipped and periodic.new_findings == 0 and periodic.decisions == []
    finally:
        holder.rollback()
        holder.close()
    with factory() as session:
        after = diagnose_job(session, job_id=job, settings=get_settings(), skip_if_busy=True)
        session.commit()
    assert not after.skipped and len(after.decisions) == 1  # the lock is free again: a real pass


def test_the_event_fast_pass_decides_a_fatal_xid_while_a_full_pass_runs(committed) -> None:
    """A critical event must not wait for the metric pass of a huge job: only the decide step is shared."""
    from service.diagnosis.service import diagnose_events

    factory = sessionmaker(bind=committed)
    job = _shipped_xid(committed)
    holder = _hold_pass_lock(committed, job)
    try:
        with factory() as session:
            fast = diagnose_events(session, job_id=job, settings=get_settings())
            session.commit()
    finally:
        holder.rollback()
        holder.close()
    assert fast.new_findings >= 1 and len(fast.decisions) == 1
    assert set(fast.timings) >= {"read", "signatures", "write"} and "peers" not in fast.timings
    with Session(committed) as session:
        (decision,) = session.scalars(select(Decision)).all()
        assert decision.kind == "evict" and decision.node_id == session.scalar(
            select(Node.id).where(Node.name == "node-2")
        )
    with factory() as session:
        full = diagnose_job(session, job_id=job, settings=get_settings())
        session.commit()
    assert full.new_findings == 0 and full.decisions == []  # the full pass finds it decided already


def test_a_fatal_xid_is_decided_at_once_by_a_real_worker_without_beat(committed, tmp_path) -> None:
    """The critical-event path: ingest enqueues the diagnosis; no periodic pass is running."""
    import time

    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.tokens import service as tokens
    from tests.procs import running, wait_for, wait_worker_ready

    factory = sessionmaker(bind=committed)
    with factory() as session:
        token = tokens.create(session, scope="agent").token
        session.commit()
    job = f"job-{uuid.uuid4().hex[:6]}"
    with running(["faultline", "work", "--queues", "diagnosis"], log=tmp_path / "worker.log"):
        with TestClient(create_app(get_settings(), factory=factory)) as real_client:
            _ship(real_client, token, job, {})  # the job and its ranks exist before the failure
            wait_worker_ready()
            shipped = time.monotonic()
            _ship(real_client, token, job, {1: _kernel(_xid79())})

        def evictions() -> list[Decision]:
            with Session(committed) as session:
                return list(session.scalars(select(Decision).where(Decision.kind == "evict")))

        wait_for(lambda: bool(evictions()), timeout=10, what="an eviction decided from the critical event")
        took = time.monotonic() - shipped
    (decision,) = evictions()
    assert decision.state == "pending"
    print(f"decided {took:.1f} s after ingest")


def test_open_incident_is_one_per_job_and_root_cause_even_as_a_prepared_statement(session) -> None:
    """Once psycopg prepares the upsert and PostgreSQL plans it generically, it must still find its index."""
    from service.incidents.service import open_incident
    from service.models import Job

    job = Job(external_id=f"job-{uuid.uuid4().hex[:6]}", source="registered")
    session.add(job)
    session.flush()
    # Prepared on the 6th run, and planned generically (parameters unknown) from the 6th run of that on.
    opened = {open_incident(session, job=job, root_cause="gpu_hardware")[0].id for _ in range(15)}
    assert len(opened) == 1
    other, _ = open_incident(session, job=job, root_cause="network")
    assert other.id not in opened


def test_a_row_from_the_year_10000_does_not_blind_the_job(client, session, make_token) -> None:
    """Stored before ingest refused such times: the pass reads around it and still decides the real Xid."""
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    _ship(client, token, job, {2: _kernel(_xid79())})
    session.execute(
        text(
            "INSERT INTO log_events (ts, node_id, job_id, source, kind, line, severity, batch_id) "
            "SELECT '9999-12-31 23:59:59-14', node_id, job_id, source, kind, line, severity, batch_id "
            "FROM log_events WHERE kind = 'xid' LIMIT 1"
        )
    )
    result = diagnose_job(session, job_id=job, settings=get_settings())
    assert len(result.decisions) == 1
