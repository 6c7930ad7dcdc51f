"""A planned maintenance window end to end through the service: announced -> (lead time) the job asked to checkpoint
and the node drained by a `cordon` decision -> during the window the node's going down accuses, decides and counts
nothing -> after it, once its agent reports, the node enters its return gate, whose pass tells the scheduler to take it
back. The beat's pass (`tick`) runs at chosen times; the agent, the scheduler and the checks talk over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.config import get_settings
from service.decisions.lifecycle import acknowledge
from service.fleet import service as fleet
from service.jobs import ettr
from service.models import Decision, Directive, Incident, Job, MaintenanceWindow, Node, NodeEvent, Silence
from service.planned import service as planned
from tests.conftest import bearer
from tests.decide import decide, finding
from tests.factories import batch

NODE, PEER, JOB = "mw-node-1", "mw-node-2", "llm-mw"


@pytest.fixture
def tokens(client, make_token) -> dict[str, dict[str, str]]:
    client.app.state.directives.max_age = 0.0  # the agent's answer reads the directives as they are now
    return {s: bearer(make_token(s, name=f"{s}-1")) for s in ("agent", "scheduler", "operator")}


def _report(client, tokens, node: str, job: str | None = JOB) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """One batch of the node's agent (its ranks of the job, no error lines); the directives it is answered."""
    payload = batch(node, job_id=job, logs=[]) if job else batch(node, job_id=None, logs=[], processes=[])
    response = client.post("/api/v1/ingest", json=payload, headers=tokens["agent"])
    assert response.status_code == 200, response.text
    return response.json()["directives"]


def _history(session, node: Node) -> list[tuple[str, str | None, str | None, str]]:  # type: ignore[no-untyped-def]
    return [
        (e.kind, e.from_state, e.to_state, e.source)
        for e in session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id).order_by(NodeEvent.id))
    ]


def test_a_window_drains_ahead_is_no_fault_and_returns_through_the_gate(client, session, tokens) -> None:
    settings = get_settings()
    _report(client, tokens, NODE)
    _report(client, tokens, PEER)
    node = session.scalar(select(Node).where(Node.name == NODE))
    job = session.scalar(select(Job).where(Job.external_id == JOB))
    assert node is not None and job is not None and node.current_job_id == job.id

    now = datetime.now(UTC)
    # Close to the real clock: diagnosis reads the findings stored within the last hour (FINDING_HORIZON).
    starts, ends = now + timedelta(minutes=20), now + timedelta(minutes=50)
    body = {"starts_at": starts.isoformat(), "ends_at": ends.isoformat(), "reason": "PSU swap, OPS-77"}
    created = client.post(f"/api/v1/nodes/{NODE}/maintenance", json=body, headers=tokens["operator"])
    assert created.status_code == 201, created.text
    window_id = created.json()["id"]

    # 20 minutes ahead, outside the 15-minute lead time: nothing happens yet.
    assert planned.tick(session, settings=settings, now=now).prepared == []
    assert session.scalars(select(Decision).where(Decision.node_id == node.id)).all() == []

    # Within the lead time: a checkpoint request for the job and a cordon decision for the node.
    lead = starts - timedelta(seconds=settings.maintenance_lead_s) + timedelta(minutes=1)
    assert planned.tick(session, settings=settings, now=lead).prepared == [window_id]
    assert planned.tick(session, settings=settings, now=lead).prepared == []  # once
    session.expire_all()
    window = session.get_one(MaintenanceWindow, window_id)
    node = session.get_one(Node, node.id)
    assert node.state == "cordoned" and "planned maintenance" in (node.state_reason or "")
    [cordon] = session.scalars(select(Decision).where(Decision.node_id == node.id)).all()
    assert (cordon.kind, cordon.state, cordon.incident_id) == ("cordon", "pending", None)
    assert "planned maintenance" in cordon.reason and "PSU swap" in cordon.reason
    assert cordon.evidence["maintenance_window"] == window_id
    checkpoint = session.get_one(Directive, window.checkpoint_directive_id)
    assert (checkpoint.kind, checkpoint.job_id, checkpoint.params["deadline"]) == (
        "checkpoint",
        job.id,
        starts.isoformat(),
    )

    # The job's agents (on every node of it) are asked, with the reason and the deadline, in their ingest answer.
    [asked] = [d for d in _report(client, tokens, PEER) if d["kind"] == "checkpoint"]
    assert asked["job_id"] == JOB and asked["deadline"] == starts.isoformat() and "PSU swap" in asked["reason"]

    # The scheduler's adapter sees the cordon through the normal decision API and acknowledges it.
    pending = client.get("/api/v1/decisions", params={"state": "pending"}, headers=tokens["scheduler"]).json()
    assert [d["id"] for d in pending["items"] if d["node"] == NODE] == [cordon.id]
    acknowledge(
        session, decision_id=cordon.id, outcome="done", message="drained in Slurm", actor="scheduler:s",
        now=lead, settings=settings,
    )  # fmt: skip

    # During the window the node goes down: its GPUs drop, its agent falls silent. What diagnosis makes of that
    # accuses, decides and evicts nothing.
    during = starts + timedelta(minutes=5)
    down = [
        finding(NODE, detector="alerts", category="node_down", at=during, key="down"),
        finding(NODE, detector="signatures", category="gpu_fell_off_bus", at=during, key="xid79", subject=f"{NODE}/0"),
    ]
    result = decide(session, job, down, during)
    assert result.decisions == []
    incident = session.get_one(Incident, result.incidents[0])
    assert incident.silence_id == window.silence_id
    evictions = select(Decision).where(Decision.node_id == node.id, Decision.kind.in_(("evict", "diagnose")))
    assert session.scalars(evictions).all() == []
    session.expire_all()
    assert session.get_one(Node, node.id).state == "cordoned"  # not a suspect

    # Nor does it count: the job's ETTR incidents and the fleet's repair figures leave it out.
    assert [s.incident_id for s in ettr.incident_spans(session, job=job)] == []
    counted = fleet.window_times(session, window_s=7 * 86400, now=during + timedelta(minutes=1))
    assert incident.id not in [t.incident_id for t in counted]

    # The window ends; until the node's agent reports again it stays out.
    after = ends + timedelta(minutes=2)
    assert planned.tick(session, settings=settings, now=after).returned == []
    session.execute(
        Node.__table__.update().where(Node.id == node.id).values(last_seen_at=ends + timedelta(minutes=1))
    )  # its agent's first batch after the window
    assert planned.tick(session, settings=settings, now=after).returned == [window_id]
    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "returning"
    silence = session.get_one(Silence, window.silence_id)
    assert silence.expired_at is not None  # new faults count again from now on
    assert _history(session, node) == [
        ("maintenance_drain", "healthy", "cordoned", "maintenance"),
        ("cordon_done", "cordoned", "cordoned", "decision_ack"),
        ("maintenance_over", "cordoned", "returning", "maintenance"),
    ]
    assert client.get("/api/v1/maintenance", headers=tokens["operator"]).json()["items"][0]["state"] == "over"

    # Its return gate: the drained node's level-2 checks; a clean pass tells the scheduler to take it back.
    [gate] = [d for d in _report(client, tokens, NODE, job=None) if d["kind"] == "run_checks"]
    assert (gate["level"], gate["return_on_pass"], gate["undrain"]) == (2, True, True)
    payload = batch(NODE, job_id=None, metrics=[], logs=[], processes=[])
    payload["checks"] = [
        {
            "ts": datetime.now(UTC).isoformat(),
            "directive_id": gate["id"],
            "check": c,
            "subject": "gpu:0",
            "status": "pass",
        }
        for c in ("nvml_state", "gemm_bf16")
    ]
    assert client.post("/api/v1/ingest", json=payload, headers=tokens["agent"]).status_code == 200
    session.expire_all()
    assert session.get_one(Node, node.id).state == "healthy"
    made = session.scalars(select(Decision).where(Decision.node_id == node.id).order_by(Decision.id)).all()
    assert [(d.kind, d.state, d.incident_id) for d in made] == [("cordon", "done", None), ("return", "pending", None)]
    assert _history(session, node)[-1] == ("gate_passed", "returning", "healthy", "checks")
    session.refresh(incident)
    assert (incident.state, incident.resolution) == ("resolved", f"planned maintenance (window {window_id})")


def test_a_cancelled_window_gives_the_drained_node_back_through_its_gate(client, session, tokens) -> None:
    settings = get_settings()
    _report(client, tokens, NODE, job=None)
    now = datetime.now(UTC)
    body = {"starts_at": (now + timedelta(minutes=10)).isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat()}
    created = client.post(
        f"/api/v1/nodes/{NODE}/maintenance", json=body | {"reason": "firmware"}, headers=tokens["operator"]
    )
    window_id = created.json()["id"]
    assert planned.tick(session, settings=settings, now=now).prepared == [window_id]  # within the lead time at once
    window = session.get_one(MaintenanceWindow, window_id)
    assert window.checkpoint_directive_id is None  # no job ran on the node: nothing to checkpoint

    cancelled = client.delete(f"/api/v1/nodes/{NODE}/maintenance/{window_id}", headers=tokens["operator"])
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    session.expire_all()
    node = session.scalar(select(Node).where(Node.name == NODE))
    assert node is not None and node.state == "returning"
    assert session.get_one(Silence, window.silence_id).expired_at is not None
    assert [d["kind"] for d in _report(client, tokens, NODE, job=None)] == ["run_checks"]


def test_a_node_already_out_of_service_is_left_as_it_is(client, session, tokens) -> None:
    settings = get_settings()
    _report(client, tokens, NODE, job=None)
    cordoned = client.post(f"/api/v1/nodes/{NODE}/cordon", json={"reason": "bad fan"}, headers=tokens["operator"])
    assert cordoned.status_code == 200
    now = datetime.now(UTC)
    body = {"starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat(), "reason": "fan swap"}
    window_id = client.post(f"/api/v1/nodes/{NODE}/maintenance", json=body, headers=tokens["operator"]).json()["id"]
    planned.tick(session, settings=settings, now=now)
    session.execute(
        Node.__table__.update().where(Node.name == NODE).values(last_seen_at=now + timedelta(hours=1, minutes=1))
    )
    assert planned.tick(session, settings=settings, now=now + timedelta(hours=1, minutes=2)).returned == [window_id]
    session.expire_all()
    node = session.scalar(select(Node).where(Node.name == NODE))
    assert node is not None and node.state == "cordoned"  # a person's cordon: a person returns it
    kinds = [k for k, *_ in _history(session, node)]
    assert kinds == ["cordon", "maintenance_drain", "maintenance_over"]
    # Only the person's cordon decision: the window added none.
    assert len(session.scalars(select(Decision).where(Decision.node_id == node.id)).all()) == 1
