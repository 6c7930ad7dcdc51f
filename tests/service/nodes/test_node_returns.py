"""A node coming back as the real world brings it: every transition with its source, a scheduler reporting a return,
work placed on a quarantined node before its gate (a rank map, or its agent's ranks), the gate's verdict, and the
latest eviction as what the node shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from service.config import get_settings
from service.decisions.lifecycle import acknowledge
from service.models import (
    Decision,
    Directive,
    Finding,
    Node,
    NodeEvent,
    NotificationChannel,
    NotificationDelivery,
    ProcessSnapshot,
)
from service.nodes import lifecycle, returns
from tests import rows
from tests.conftest import bearer
from tests.factories import batch


@pytest.fixture
def tokens(client, make_token) -> dict[str, dict[str, str]]:
    client.app.state.directives.max_age = 0.0  # the agent's answer reads the directives as they are now
    return {s: bearer(make_token(s, name=f"{s}-1")) for s in ("agent", "scheduler", "operator")}


def _history(session, node: Node) -> list[tuple[str, str | None, str | None, str]]:  # type: ignore[no-untyped-def]
    """(kind, from state, to state, source), oldest first."""
    return [
        (e.kind, e.from_state, e.to_state, e.source)
        for e in session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id).order_by(NodeEvent.id))
    ]


def _agent_node(client, session, tokens, name: str, **values: Any) -> Node:  # type: ignore[no-untyped-def]
    """A node whose agent reports (so it can receive directives), in the given state."""
    assert client.post("/api/v1/ingest", json=batch(name, job_id=None), headers=tokens["agent"]).status_code == 200
    node = session.scalar(select(Node).where(Node.name == name))
    for key, value in values.items():
        setattr(node, key, value)
    session.flush()
    return node


def _directives(client, tokens, name: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return client.post("/api/v1/ingest", json=batch(name, job_id=None), headers=tokens["agent"]).json()["directives"]


def _answer(client, tokens, name: str, directive_id: str, **statuses: str) -> None:  # type: ignore[no-untyped-def]
    payload = batch(name, job_id=None, metrics=[], logs=[], processes=[])
    now = datetime.now(UTC).isoformat()
    payload["checks"] = [
        {"ts": now, "directive_id": directive_id, "check": check, "subject": "gpu:0", "status": status}
        for check, status in statuses.items()
    ]
    assert client.post("/api/v1/ingest", json=payload, headers=tokens["agent"]).status_code == 200


def _evict(session, node: Node, *, reason: str, at: datetime) -> Decision:  # type: ignore[no-untyped-def]
    incident = rows.incident(session, job=rows.job(session), suspects=[node.name], root_cause=f"r{at.timestamp()}")
    decision = rows.decision(session, incident=incident, node=node, reason=reason)
    acknowledge(
        session, decision_id=decision.id, outcome="done", message=f"drained {node.name} in Slurm", actor="scheduler:s",
        now=at, settings=get_settings(),
    )  # fmt: skip
    return decision


def _alerts():  # type: ignore[no-untyped-def]
    """How many chat deliveries about nodes placed before their gate (the evictions resolve incidents, which alert)."""
    return (
        select(func.count()).select_from(NotificationDelivery).where(NotificationDelivery.event == "node_before_gate")
    )


def _channel(session) -> NotificationChannel:  # type: ignore[no-untyped-def]
    channel = NotificationChannel(
        name=f"oncall-{datetime.now(UTC).timestamp()}", kind="json", url="http://127.0.0.1:9/"
    )
    session.add(channel)
    session.flush()
    return channel


# --- a scheduler reports a return ------------------------------------------------------------------------------


def test_a_scheduler_reports_a_return_and_the_gate_makes_the_node_healthy(client, session, tokens) -> None:
    node = _agent_node(client, session, tokens, "back-1")
    now = datetime.now(UTC)
    _evict(session, node, reason="evict back-1: Xid 79 on GPU 3", at=now)
    assert node.state == "evicted" and node.quarantined_until is not None

    url = "/api/v1/nodes/back-1/return"
    reported = client.post(url, json={"reason": "schedulable again in Slurm"}, headers=tokens["scheduler"])
    assert reported.status_code == 200, reported.text
    body = reported.json()
    assert body["state"] == "returning" and body["work_before_gate_at"] is None
    assert (body["history"][0]["kind"], body["history"][0]["source"]) == ("return_reported", "scheduler")
    assert "before its quarantine ended" in body["history"][0]["reason"]
    # Reported twice (the adapter's next sweep): nothing more happens.
    again = client.post(url, json={"reason": "schedulable again in Slurm"}, headers=tokens["scheduler"])
    assert again.status_code == 200 and again.json()["history"][0]["kind"] == "return_reported"

    # It may run work already: the checks that leave ranks alone, forced past the agent's refusal.
    [gate] = _directives(client, tokens, "back-1")
    assert (gate["level"], gate["force"], gate["return_on_pass"], gate["undrain"]) == (1, True, True, False)
    _answer(client, tokens, "back-1", gate["id"], nvml_state="pass", host="pass")
    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "healthy" and node.quarantined_until is None
    assert _history(session, node) == [
        ("evict_done", "healthy", "evicted", "decision_ack"),
        ("return_reported", "evicted", "returning", "scheduler"),
        ("gate_passed", "returning", "healthy", "checks"),
    ]
    # The scheduler put it back itself: nobody tells it to again.
    assert session.scalars(select(Decision).where(Decision.node_id == node.id, Decision.kind == "return")).all() == []


def test_a_node_accused_while_returning_passes_its_gate_as_a_suspect(client, session, tokens) -> None:
    node = _agent_node(client, session, tokens, "back-6", state="evicted")
    client.post("/api/v1/nodes/back-6/return", json={"reason": "resumed"}, headers=tokens["scheduler"])
    session.expire_all()
    incident = rows.incident(session, job=rows.job(session), suspects=["back-6"], state="open")
    now, settings = datetime.now(UTC), get_settings()
    lifecycle.mark_suspects(session, incident=incident, names=["back-6"], now=now, settings=settings)
    assert session.get_one(Node, node.id).state == "returning"  # accused during its gate: it waits for the gate
    [gate] = _directives(client, tokens, "back-6")
    _answer(client, tokens, "back-6", gate["id"], nvml_state="pass")
    session.expire_all()
    assert session.get_one(Node, node.id).state == "suspect"


def test_a_scheduler_may_not_force_and_waits_for_its_own_pending_cordon(client, session, tokens) -> None:
    node = rows.node(session, "back-2")
    url = "/api/v1/nodes/back-2/return"
    forced = client.post(url, json={"reason": "x", "force": True}, headers=tokens["scheduler"])
    assert forced.status_code == 422 and forced.json()["message"].startswith("force:")
    diagnosed = client.post(
        url, json={"reason": "x", "diagnostics": {"passed": True, "tool": "hc"}}, headers=tokens["scheduler"]
    )
    assert diagnosed.status_code == 422 and diagnosed.json()["message"].startswith("diagnostics:")

    client.post("/api/v1/nodes/back-2/cordon", json={"reason": "fans"}, headers=tokens["operator"])
    # The scheduler has not cordoned it yet: what it sees is the moment before, not a return.
    early = client.post(url, json={"reason": "schedulable"}, headers=tokens["scheduler"])
    assert early.status_code == 409 and "cordon decision" in early.json()["message"]
    [cordon] = session.scalars(select(Decision).where(Decision.node_id == node.id))
    client.post(f"/api/v1/decisions/{cordon.id}/ack", json={"outcome": "done"}, headers=tokens["scheduler"])
    back = client.post(url, json={"reason": "uncordoned by hand"}, headers=tokens["scheduler"])
    assert back.status_code == 200 and back.json()["state"] == "returning"
    # A healthy node reported back: nothing to do.
    rows.node(session, "back-3")
    same = client.post("/api/v1/nodes/back-3/return", json={"reason": "x"}, headers=tokens["scheduler"])
    assert same.status_code == 200 and same.json()["state"] == "healthy" and same.json()["history"] == []
    assert (
        client.post("/api/v1/nodes/nope/return", json={"reason": "x"}, headers=tokens["scheduler"]).status_code == 404
    )


def test_a_failed_gate_of_a_node_in_service_asks_for_its_eviction(client, session, tokens) -> None:
    node = _agent_node(client, session, tokens, "back-4", state="in_repair")
    client.post("/api/v1/nodes/back-4/return", json={"reason": "resumed"}, headers=tokens["scheduler"])
    [gate] = _directives(client, tokens, "back-4")
    _answer(client, tokens, "back-4", gate["id"], nvml_state="fail")
    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "returning"  # it runs work until the scheduler takes it out
    evict = session.scalars(select(Decision).where(Decision.node_id == node.id, Decision.kind == "evict")).one()
    assert evict.state == "pending" and evict.reason == "return gate failed on back-4: nvml_state gpu:0"
    assert evict.evidence["checks"]["directive_id"] == gate["id"]
    assert session.get_one(Directive, gate["id"]).params["concluded"].startswith("checks failed")
    client.post(f"/api/v1/decisions/{evict.id}/ack", json={"outcome": "done"}, headers=tokens["scheduler"])
    session.expire_all()
    assert session.get_one(Node, node.id).state == "evicted"
    assert [k for k, *_ in _history(session, node)] == ["return_reported", "gate_failed", "evict_done"]


def test_a_failed_gate_of_a_node_a_person_returned_sends_it_back(client, session, tokens) -> None:
    node = _agent_node(client, session, tokens, "back-5", state="in_repair")
    back = client.post("/api/v1/nodes/back-5/return", json={"reason": "PSU swapped"}, headers=tokens["operator"])
    assert back.json()["state"] == "returning"
    [gate] = _directives(client, tokens, "back-5")
    _answer(client, tokens, "back-5", gate["id"], nvml_state="pass", gemm_bf16="fail")
    session.expire_all()
    assert session.get_one(Node, node.id).state == "in_repair"
    assert session.scalars(select(Decision).where(Decision.node_id == node.id)).all() == []
    assert _history(session, node)[-1] == ("gate_failed", "returning", "in_repair", "checks")


# --- work placed before the gate -------------------------------------------------------------------------------


def test_a_rank_map_placing_an_evicted_node_shows_it_alerts_once_and_runs_the_gate(client, session, tokens) -> None:
    channel = _channel(session)
    node = _agent_node(client, session, tokens, "placed-1")
    _evict(session, node, reason="evict placed-1: NVLink errors on GPU 2", at=datetime.now(UTC))
    ranks = [{"rank": r, "node": n, "local_rank": r % 2} for r, n in enumerate(["other-1", "other-1", "placed-1"])]
    job = {"job_id": "job-placed", "world_size": 3, "ranks": ranks}
    assert client.post("/api/v1/jobs", json=job, headers=tokens["scheduler"]).status_code in (200, 201)

    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "returning" and node.work_before_gate_at is not None
    detail = client.get("/api/v1/nodes/placed-1", headers=tokens["scheduler"]).json()
    assert detail["current_job"] == "job-placed" and detail["work_before_gate_at"] is not None
    event = detail["history"][0]
    assert (event["kind"], event["source"], event["from_state"]) == ("placed_before_gate", "placement", "evicted")
    assert "placed in job job-placed while evicted" in event["reason"]
    [shown] = returns.before_gate(session)
    assert (shown.node, shown.job, shown.was) == ("placed-1", "job-placed", "evicted")
    assert returns.before_gate(session, job_id=node.current_job_id) == [shown]

    [alert] = session.scalars(select(NotificationDelivery).where(NotificationDelivery.event == "node_before_gate"))
    assert alert.event == "node_before_gate" and alert.incident_id is None
    assert alert.payload["title"] == "placed-1 runs job job-placed before its return gate (it was evicted)"
    assert alert.payload["url"].endswith("/nodes/placed-1")
    # The launcher registers the same map again: no second event, no second alert.
    client.post("/api/v1/jobs", json=job, headers=tokens["scheduler"])
    assert session.scalar(_alerts().where(NotificationDelivery.channel_id == channel.id)) == 1
    assert [k for k, *_ in _history(session, node)].count("placed_before_gate") == 1

    [gate] = _directives(client, tokens, "placed-1")
    assert (gate["level"], gate["force"], gate["return_on_pass"]) == (1, True, True)
    _answer(client, tokens, "placed-1", gate["id"], nvml_state="pass")
    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "healthy" and node.work_before_gate_at is None
    assert returns.before_gate(session) == []


def test_a_rank_map_that_still_names_a_node_from_before_its_eviction_places_nothing(client, session, tokens) -> None:
    ranks = [{"rank": 0, "node": "stale-1", "local_rank": 0}, {"rank": 1, "node": "stale-2", "local_rank": 0}]
    job = {"job_id": "job-stale", "world_size": 2, "ranks": ranks}
    client.post("/api/v1/jobs", json=job, headers=tokens["scheduler"])
    node = session.scalar(select(Node).where(Node.name == "stale-2"))
    _evict(session, node, reason="evict stale-2: Xid 79", at=datetime.now(UTC))
    # The launcher sends its old map again (say, to change the hang timeout): it did not place the node anew.
    client.post("/api/v1/jobs", json={**job, "hang_timeout_s": 900}, headers=tokens["scheduler"])
    session.expire_all()
    assert session.get_one(Node, node.id).state == "evicted"


def test_an_agent_reporting_new_ranks_on_an_evicted_node_places_it_but_its_dying_ranks_do_not(
    client, session, tokens
) -> None:
    _channel(session)
    assert client.post("/api/v1/ingest", json=batch("dying-1"), headers=tokens["agent"]).status_code == 200
    node = session.scalar(select(Node).where(Node.name == "dying-1"))
    # Its processes were seen before it went out (the batch above), so the same pids afterwards are its old ranks.
    earlier = session.scalar(select(func.min(ProcessSnapshot.ts)).where(ProcessSnapshot.node_id == node.id))
    _evict(session, node, reason="evict dying-1: Xid 79", at=earlier + timedelta(milliseconds=1))
    assert client.post("/api/v1/ingest", json=batch("dying-1"), headers=tokens["agent"]).status_code == 200
    session.expire_all()
    assert session.get_one(Node, node.id).state == "evicted"

    fresh = batch("dying-1")
    for proc in fresh["processes"]:
        proc["pid"] += 100  # a new generation of ranks: the scheduler put the job back on this machine
    assert client.post("/api/v1/ingest", json=fresh, headers=tokens["agent"]).status_code == 200
    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "returning" and node.work_before_gate_at is not None
    placed = _history(session, node)[-1]
    assert placed == ("placed_before_gate", "evicted", "returning", "placement")
    reason = session.scalar(select(NodeEvent.reason).where(NodeEvent.node_id == node.id).order_by(NodeEvent.id.desc()))
    assert "its agent reports processes of the job it did not run before (pids 4100, 4101)" in reason
    assert session.scalar(_alerts()) == 1
    assert node.current_job_id is not None


# --- the latest eviction ---------------------------------------------------------------------------------------


def test_a_node_evicted_twice_shows_the_second_eviction(client, session, tokens) -> None:
    node = rows.node(session, "twice-1")
    first_at = datetime.now(UTC) - timedelta(minutes=22)
    _evict(session, node, reason="evict twice-1: NVLink errors on GPU 2", at=first_at)
    # Nobody told faultline it came back; the scheduler evicts it again for another fault on another GPU.
    second = _evict(session, node, reason="evict twice-1: double-bit ECC error", at=datetime.now(UTC))
    session.add(
        Finding(
            dedup_key="ecc:twice-1/5", node_id=node.id, detector="signatures", category="gpu_hardware",
            subject_kind="gpu", subject="twice-1/5", confidence=0.99, summary="double-bit ECC error",
            blame="infrastructure", action="evict", evidence={}, observed_at=datetime.now(UTC),
        )
    )  # fmt: skip
    session.flush()
    third = rows.decision(session, incident=None, node=node, reason="evict twice-1: double-bit ECC on GPU 5")
    third.evidence = {"findings": [{"id": session.scalar(select(Finding.id).where(Finding.node_id == node.id))}]}
    last_at = datetime.now(UTC) + timedelta(seconds=1)
    acknowledge(
        session, decision_id=third.id, outcome="done", message="drained", actor="scheduler:s", now=last_at,
        settings=get_settings(),
    )  # fmt: skip
    detail = client.get("/api/v1/nodes/twice-1", headers=tokens["scheduler"]).json()
    assert detail["state"] == "evicted" and detail["state_reason"] == "evict twice-1: double-bit ECC on GPU 5"
    assert datetime.fromisoformat(detail["state_changed_at"]) == last_at
    eviction = detail["last_eviction"]
    assert eviction["reason"] == "evict twice-1: double-bit ECC on GPU 5" and eviction["gpus"] == [5]
    assert eviction["decision_id"] == third.id and eviction["decision_id"] != second.id
    assert [e["kind"] for e in detail["history"]] == ["evict_done"] * 3


def test_gpus_of_an_eviction_come_from_its_reason_when_its_findings_name_none(session) -> None:
    node = rows.node(session)
    reason = f"evict {node.name}: Xid 79 (GPU has fallen off the bus) on GPU 3"
    _evict(session, node, reason=reason, at=datetime.now(UTC))
    event = session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id)).one()
    assert event.details == {"gpus": [3], "scheduler": f"drained {node.name} in Slurm"}
    assert event.reason == reason
    assert node.state in lifecycle.OUT_OF_SERVICE


def test_the_chat_message_of_a_node_at_work_before_its_gate_links_to_the_node() -> None:
    from service.notify import formats

    payload = {
        "event": "node_before_gate",
        "time": "2026-11-28T10:00:00+00:00",
        "node": "gpu-node-005",
        "title": "gpu-node-005 runs job demo-job before its return gate (it was evicted)",
        "summary": "placed in job demo-job while evicted, before its return gate",
        "url": "http://faultline/nodes/gpu-node-005",
    }
    slack = formats.render("slack", [payload])
    assert slack["blocks"][0]["text"]["text"] == payload["title"]
    assert slack["blocks"][-1]["elements"][0]["text"]["text"] == "Open node"
    assert "Root cause" not in str(slack)
    lark = formats.render("lark", [payload])
    assert lark["card"]["header"]["template"] == "red" and "Open node" in str(lark)
    digest = formats.render("slack", [payload, {**payload, "node": "gpu-node-006", "title": "gpu-node-006 runs"}])
    assert "gpu-node-006 runs" in str(digest)


def test_a_cordoned_node_may_run_its_own_job_again_but_another_job_there_is_placed_before_its_gate(
    client, session, tokens
) -> None:
    _channel(session)
    assert client.post("/api/v1/ingest", json=batch("cordoned-1"), headers=tokens["agent"]).status_code == 200
    node = session.scalar(select(Node).where(Node.name == "cordoned-1"))
    earlier = session.scalar(select(func.min(ProcessSnapshot.ts)).where(ProcessSnapshot.node_id == node.id))
    # A shared cause's cordon (its switch down): no new work, the job running there left be.
    assert lifecycle.cordon(session, node=node, reason="switch leaf-3 down", actor="faultline", now=earlier)
    session.flush()

    restarted = batch("cordoned-1")
    for proc in restarted["processes"]:
        proc["pid"] += 100  # the job restarted in its own allocation (torchrun's restart): new pids, the same job
    assert client.post("/api/v1/ingest", json=restarted, headers=tokens["agent"]).status_code == 200
    session.expire_all()
    assert session.get_one(Node, node.id).state == "cordoned" and session.scalar(_alerts()) == 0

    other = batch("cordoned-1", job_id="job-2")
    for proc in other["processes"]:
        proc["pid"] += 200  # a scheduler put another job there: new work before the gate
    assert client.post("/api/v1/ingest", json=other, headers=tokens["agent"]).status_code == 200
    session.expire_all()
    node = session.get_one(Node, node.id)
    assert node.state == "returning" and node.work_before_gate_at is not None
    assert _history(session, node)[-1] == ("placed_before_gate", "cordoned", "returning", "placement")
    assert session.scalar(_alerts()) == 1
