"""The diagnose loop closed through the API: a scheduler carries out a diagnose decision, the node's agent gets
run_checks, and its results evict the node, reset one GPU, or return the node and resolve the incident."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from service.models import Decision, Directive, Finding, Incident, Node
from tests import rows
from tests.conftest import bearer
from tests.factories import batch


@pytest.fixture
def setup(client, session, make_token) -> dict[str, Any]:
    client.app.state.directives.max_age = 0.0
    agent, scheduler = bearer(make_token("agent")), bearer(make_token("scheduler"))
    assert client.post("/api/v1/ingest", json=batch("suspect"), headers=agent).status_code == 200
    node = session.scalar(select(Node).where(Node.name == "suspect"))
    node.state = "suspect"
    job = rows.job(session)
    incident = rows.incident(session, job=job, suspects=["suspect"], root_cause="straggler", state="open")
    diagnose = rows.decision(session, incident=incident, node=node, kind="diagnose", reason="GPU 1 less busy")
    session.flush()
    return {"agent": agent, "scheduler": scheduler, "node": node, "incident": incident, "diagnose": diagnose}


def _drain(client, setup) -> dict[str, Any]:
    """The scheduler drains the node for the diagnose decision; the agent's next answer carries run_checks."""
    acked = client.post(
        f"/api/v1/decisions/{setup['diagnose'].id}/ack", json={"outcome": "done"}, headers=setup["scheduler"]
    )
    assert acked.status_code == 200, acked.text
    [directive] = client.post("/api/v1/ingest", json=batch("suspect"), headers=setup["agent"]).json()["directives"]
    assert directive["kind"] == "run_checks" and directive["level"] == 2
    assert directive["decision_id"] == setup["diagnose"].id
    return directive


def _results(client, setup, directive_id: str, items: list[dict[str, Any]]) -> None:
    payload = batch("suspect", job_id=None, metrics=[], logs=[], processes=[])
    now = datetime.now(UTC).isoformat()
    payload["checks"] = [{"ts": now, "directive_id": directive_id, **item} for item in items]
    assert client.post("/api/v1/ingest", json=payload, headers=setup["agent"]).status_code == 200


def test_a_clean_pass_returns_the_node_and_resolves_the_incident(client, session, setup):
    directive = _drain(client, setup)
    _results(
        client,
        setup,
        directive["id"],
        [
            {"check": "nvml_state", "subject": "gpu:0", "status": "pass"},
            {"check": "nvml_state", "subject": "gpu:1", "status": "pass"},
            {"check": "dcgm", "subject": "node", "status": "not_available", "evidence": {"reason": "no dcgmi"}},
        ],
    )
    session.expire_all()
    assert session.get(Node, setup["node"].id).state == "healthy"
    incident = session.get(Incident, setup["incident"].id)
    assert incident.state == "resolved" and "stop-time checks passed on suspect" in incident.resolution
    returned = session.scalar(select(Decision).where(Decision.node_id == setup["node"].id, Decision.kind == "return"))
    assert returned is not None and returned.state == "pending"  # the scheduler puts the node back
    stored = session.get(Directive, directive["id"])
    assert stored.params["concluded"] == "passed: node returned, incident resolved"
    # Answered: the agent is not asked again.
    assert client.post("/api/v1/ingest", json=batch("suspect"), headers=setup["agent"]).json()["directives"] == []


@pytest.mark.parametrize(("direction", "blame"), [("low", "user_code"), ("high", "unknown")])
def test_a_pass_after_a_gpu_waited_for_its_input_blames_the_jobs_own_input(client, session, setup, direction, blame):
    """A GPU less busy than its peers waited for its input; its machine passing every check leaves the job's input
    pipeline: the incident needs no person to settle its blame. A busier GPU whose machine passed stays unknown."""
    incident = setup["incident"]
    incident.blame = "unknown"
    session.add(
        Finding(
            dedup_key="peers:suspect/1",
            job_id=incident.job_id,
            incident_id=incident.id,
            node_id=setup["node"].id,
            detector="peers",
            category="straggler",
            subject_kind="gpu",
            subject="suspect/1",
            confidence=0.6,
            summary="suspect GPU 1 is its peers' outlier",
            blame="unknown",
            action="diagnose",
            evidence={"metrics": [{"metric": "gpu_util", "direction": direction}]},
            observed_at=datetime.now(UTC),
        )
    )
    session.flush()
    directive = _drain(client, setup)
    _results(client, setup, directive["id"], [{"check": "nvml_state", "subject": "gpu:1", "status": "pass"}])
    session.expire_all()
    resolved = session.get(Incident, incident.id)
    assert resolved.state == "resolved" and resolved.blame == blame
    assert ("the job's own input" in resolved.resolution) == (blame == "user_code")


def test_a_failing_check_evicts_the_node_with_the_finding_in_the_incident(client, session, setup):
    directive = _drain(client, setup)
    _results(
        client,
        setup,
        directive["id"],
        [
            {"check": "nvml_state", "subject": "gpu:0", "status": "pass"},
            {
                "check": "numerics",
                "subject": "gpu:1",
                "status": "fail",
                "evidence": {"problems": ["its GEMM's bits differ from the other GPUs'"]},
            },
        ],
    )
    session.expire_all()
    evict = session.scalar(select(Decision).where(Decision.node_id == setup["node"].id, Decision.kind == "evict"))
    assert evict is not None and evict.state == "pending" and evict.incident_id == setup["incident"].id
    assert evict.reason == "stop-time checks failed on suspect: numerics gpu:1"
    [finding] = session.scalars(select(Finding).where(Finding.detector == "stop_checks")).all()
    assert finding.incident_id == setup["incident"].id and finding.id in evict.evidence["checks"]["findings"]
    assert session.get(Incident, setup["incident"].id).state != "resolved"  # until the eviction is carried out


def test_a_pending_row_remap_on_one_gpu_resets_that_gpu(client, session, setup):
    directive = _drain(client, setup)
    _results(
        client,
        setup,
        directive["id"],
        [
            {
                "check": "nvml_state",
                "subject": "gpu:1",
                "status": "fail",
                "evidence": {"problems": ["row remap pending: 1"], "action": "reset_gpu"},
            },
        ],
    )
    session.expire_all()
    [remedy] = session.scalars(
        select(Decision).where(Decision.node_id == setup["node"].id, Decision.kind != "diagnose")
    )
    assert (remedy.kind, remedy.gpu) == ("reset_gpu", 1)


def test_a_refused_suite_leaves_the_node_to_a_person(client, session, setup):
    directive = _drain(client, setup)
    _results(client, setup, directive["id"], [{"refused": "2 training processes run on this node"}])
    session.expire_all()
    assert session.get(Node, setup["node"].id).state == "suspect"
    assert session.scalars(select(Decision).where(Decision.kind.in_(("evict", "return")))).all() == []
    assert session.get(Directive, directive["id"]).params["concluded"].startswith("no verdict")


def test_results_of_checks_run_by_hand_act_on_nothing(client, session, setup):
    _results(client, setup, "hand-run", [{"check": "numerics", "subject": "gpu:1", "status": "fail"}])
    session.expire_all()
    assert session.scalars(select(Decision).where(Decision.kind == "evict")).all() == []


@pytest.mark.parametrize(("status", "state"), [("pass", "healthy"), ("fail", "in_repair")])
def test_the_repair_gate_returns_a_node_only_on_a_clean_pass(client, session, make_token, status, state):
    client.app.state.directives.max_age = 0.0
    agent, operator = bearer(make_token("agent")), bearer(make_token("operator"))
    client.post("/api/v1/ingest", json=batch("repaired"), headers=agent)
    node = session.scalar(select(Node).where(Node.name == "repaired"))
    node.state = "in_repair"
    session.flush()
    asked = client.post("/api/v1/nodes/repaired/checks", json={"level": 1, "return_on_pass": True}, headers=operator)
    assert asked.status_code == 201, asked.text
    [directive] = asked.json()["directives"]
    assert directive["params"]["return_on_pass"] is True
    payload = batch("repaired", job_id=None, metrics=[], logs=[], processes=[])
    payload["checks"] = [
        {
            "ts": datetime.now(UTC).isoformat(),
            "directive_id": directive["id"],
            "check": "nvml_state",
            "subject": "gpu:0",
            "status": status,
        }
    ]
    assert client.post("/api/v1/ingest", json=payload, headers=agent).status_code == 200
    session.expire_all()
    assert session.get(Node, node.id).state == state
    assert session.scalars(select(Decision).where(Decision.kind == "evict")).all() == []  # no incident: no eviction
