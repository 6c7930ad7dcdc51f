"""POST /api/v1/preflight: a preflight's outcome, sent by the agent's own client (agents/preflight/cli.py `Service`)
from a real search (agents/preflight/search.py) over a simulated allocation, becomes check results and, through the
job's decide step and the policy, decisions for the named nodes; GET /api/v1/preflight/criteria serves the fleet's
cut-offs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from agents.preflight.cli import Service
from agents.preflight.runner import Run, as_plain
from agents.preflight.search import Figures, Group, LocalReport, Round, search
from service.models import CheckResult, Decision, Finding, Job, Node
from tests.conftest import bearer, count

NODES = [f"pf-{i:02d}" for i in range(8)]
SLOW, BAD_GPU, PAIR = "pf-02", "pf-05", ("pf-01", "pf-06")


def _measure(groups: list[Group]) -> list[Figures]:
    out = []
    for g in groups:
        if PAIR[0] in g and PAIR[1] in g:
            out.append(Figures(error="timed out after 30 s"))
        else:
            out.append(Figures(min(4.0 if n == SLOW else 40.0 for n in g), 30.0))
    return out


def _outcome() -> dict[str, Any]:
    clock = iter(range(100))

    def stamp(r: Round) -> None:  # the rounds 5 s apart, as a real run's
        r.ended_at = (datetime.now(UTC) - timedelta(seconds=120) + timedelta(seconds=5 * next(clock))).isoformat()

    local = {n: LocalReport(n, figures={"gemm_tflops": 500.0 if n == BAD_GPU else 780.0}) for n in NODES}
    return as_plain(search(NODES, _measure, local=local, on_round=stamp))


def _results() -> dict[str, list[dict[str, Any]]]:
    return {
        n: [
            {
                "check": "gemm_bf16",
                "subject": "gpu:0",
                "status": "pass",
                "measured": 500.0 if n == BAD_GPU else 780.0,
                "unit": "TFLOPS",
                "evidence": {"model": "cpu-test-model"},
            }
        ]
        for n in NODES
    }


@pytest.fixture
def service(client: Any, make_token: Callable[..., str]) -> Service:
    said: list[str] = []
    return Service("http://testserver", make_token("agent"), said.append, http=client)


def test_named_nodes_get_decisions_before_the_job_starts(service, session):
    outcome = _outcome()
    assert sorted(n["node"] for n in outcome["named"]) == sorted([SLOW, BAD_GPU, *PAIR])

    answer = service.report("job-pf-1", Run(nodes=NODES, outcome=outcome, results=_results(), seconds=12.0))

    assert answer is not None
    assert answer["named"] == sorted([SLOW, BAD_GPU, *PAIR])
    decided = {(d["node"], d["kind"]) for d in answer["decisions"]}
    # A bad GPU and a slow NIC are evicted; a pair's link condemns neither end alone: both are diagnosed.
    assert decided == {(BAD_GPU, "evict"), (SLOW, "evict"), (PAIR[0], "diagnose"), (PAIR[1], "diagnose")}
    # Through the policy's guard rails: the fleet's circuit breaker may hold the last take-outs for a person.
    states = {d["node"]: d["state"] for d in answer["decisions"]}
    assert states[BAD_GPU] == states[SLOW] == "pending", states
    assert {states[n] for n in PAIR} <= {"pending", "awaiting_approval"}, states
    job = session.scalar(select(Job).where(Job.external_id == "job-pf-1"))
    rows = session.scalars(select(Decision).where(Decision.job_id == job.id)).all()
    assert {r.id for r in rows} == {d["id"] for d in answer["decisions"]}
    # Every node has its summary result; the healthy ones passed with a bandwidth figure.
    summaries = {
        name: r
        for r, name in session.execute(
            select(CheckResult, Node.name)
            .join(Node, Node.id == CheckResult.node_id)
            .where(CheckResult.directive_id == f"preflight:{answer['id']}", CheckResult.check.like("preflight_%"))
        )
    }
    assert set(summaries) == set(NODES)
    assert summaries[BAD_GPU].check == "preflight_local" and summaries[BAD_GPU].verdict == "fail"
    assert summaries[SLOW].verdict == "fail" and len(summaries[SLOW].evidence["times"]) >= 2
    assert summaries[PAIR[0]].evidence["peer"] == PAIR[1]
    healthy = set(NODES) - {SLOW, BAD_GPU, *PAIR}
    assert all(summaries[n].verdict == "pass" and summaries[n].measured == 40.0 for n in healthy)
    # The findings are the job's, and none is about a healthy node.
    findings = session.execute(
        select(Node.name).join(Finding, Finding.node_id == Node.id).where(Finding.job_id == job.id)
    ).scalars()
    assert set(findings) == {SLOW, BAD_GPU, *PAIR}


def test_a_second_report_of_the_same_job_decides_nothing_twice(service, session):
    run = Run(nodes=NODES, outcome=_outcome(), results=_results(), seconds=12.0)
    first = service.report("job-pf-2", run)
    second = service.report("job-pf-2", run)
    assert first is not None and second is not None and first["decisions"]
    assert second["decisions"] == []  # the open incidents already decided on these nodes
    assert count(session, "decisions") == len(first["decisions"])


def test_a_registered_job_keeps_its_ranks(client, session, make_token, service):
    scheduler = bearer(make_token("scheduler"))
    ranks = [{"rank": i, "node": n, "local_rank": 0} for i, n in enumerate(NODES)]
    assert client.post(
        "/api/v1/jobs", json={"job_id": "job-pf-3", "world_size": 8, "ranks": ranks}, headers=scheduler
    ).status_code in (200, 201)
    answer = service.report("job-pf-3", Run(nodes=NODES, outcome=_outcome(), results=_results()))
    assert answer is not None and len(answer["decisions"]) == 4


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b["named"].append({"node": "elsewhere", "shape": "slow", "why": "x"}), "not in `nodes`"),
        (lambda b: b["nodes"].append(b["nodes"][0]), "listed twice"),
        (lambda b: b["named"].append({"node": b["nodes"][0], "shape": "unresolved", "why": "x"}), "unresolved"),
        (lambda b: b.update(job_id=""), "job_id"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(client, session, make_token, change, message):
    body = {"job_id": "job-pf-4", **_outcome(), "results": _results()}
    change(body)
    response = client.post("/api/v1/preflight", json=body, headers=bearer(make_token("agent")))
    assert response.status_code == 422
    assert message in response.text
    assert count(session, "check_results") == 0 and count(session, "decisions") == 0


def test_an_operator_token_cannot_report(client, make_token):
    body = {"job_id": "job-pf-5", **_outcome(), "results": _results()}
    assert client.post("/api/v1/preflight", json=body, headers=bearer(make_token("operator"))).status_code == 403


def test_criteria_are_the_fleets_once_it_has_history(client, session, make_token):
    agent = bearer(make_token("agent"))
    spec = client.get("/api/v1/preflight/criteria", params={"model": "NVIDIA H100 80GB HBM3"}, headers=agent)
    assert spec.status_code == 200
    assert spec.json()["checks"]["gemm_bf16"] == {"cutoff": 494.5, "basis": "spec", "history": 0, "median": None}
    node = Node(name="fleet-history")
    session.add(node)
    session.flush()
    start = datetime.now(UTC) - timedelta(days=1)
    session.add_all(
        CheckResult(
            node_id=node.id,
            batch_id="00000000-0000-0000-0000-000000000001",
            ts=start + timedelta(minutes=i),
            check="gemm_bf16",
            subject=f"gpu:{i % 8}",
            gpu_model="NVIDIA H100 80GB HBM3",
            status="pass",
            verdict="pass",
            basis="fleet",
            measured=790.0 + i % 5,
            unit="TFLOPS",
            evidence={},
        )
        for i in range(40)
    )
    session.flush()
    fleet = client.get("/api/v1/preflight/criteria", params={"model": "NVIDIA H100 80GB HBM3"}, headers=agent).json()
    gemm = fleet["checks"]["gemm_bf16"]
    assert gemm["basis"] == "fleet" and gemm["history"] == 40 and 740 < gemm["cutoff"] < 792
    assert fleet["checks"]["allreduce_peer"]["basis"] == "none"
    assert client.get("/api/v1/preflight/criteria", headers=agent).status_code == 422
