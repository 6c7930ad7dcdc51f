"""Node lifecycle and history across jobs: suspects, lemons, manual cordon, repair and return."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from service.config import get_settings
from service.incidents.service import resolve
from service.models import Decision, Node, NodeEvent
from service.nodes import lifecycle
from tests import rows
from tests.conftest import bearer
from tests.factories import batch


def _events(session, node: Node) -> list[tuple[str, str | None, str | None]]:  # type: ignore[no-untyped-def]
    return [
        (e.kind, e.from_state, e.to_state)
        for e in session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id).order_by(NodeEvent.id))
    ]


def test_a_node_named_in_incidents_of_three_jobs_is_a_lemon(session) -> None:
    settings, now = get_settings(), datetime.now(UTC)
    node = rows.node(session)
    for n in range(3):
        incident = rows.incident(session, job=rows.job(session), suspects=[node.name])
        changed = lifecycle.mark_suspects(session, incident=incident, names=[node.name], now=now, settings=settings)
        assert changed == ([node.name] if n == 0 else [])
        # The same incident again (the next diagnosis pass) adds nothing to the history.
        lifecycle.mark_suspects(session, incident=incident, names=[node.name], now=now, settings=settings)
    assert node.state == "suspect" and node.lemon
    assert [k for k, *_ in _events(session, node)] == ["suspect", "suspect", "suspect", "lemon"]


def test_two_incidents_of_one_job_do_not_make_a_lemon(session) -> None:
    settings, now = get_settings(), datetime.now(UTC)
    node, job = rows.node(session), rows.job(session)
    for root_cause in ("gpu_hardware", "network", "hang"):
        incident = rows.incident(session, job=job, suspects=[node.name], root_cause=root_cause)
        lifecycle.mark_suspects(session, incident=incident, names=[node.name], now=now, settings=settings)
    assert not node.lemon


def test_a_resolved_incident_clears_its_suspects_unless_another_accuses_them(session) -> None:
    settings, now = get_settings(), datetime.now(UTC)
    lone, shared = rows.node(session), rows.node(session)
    job = rows.job(session)
    first = rows.incident(session, job=job, suspects=[lone.name, shared.name], root_cause="network")
    second = rows.incident(session, job=job, suspects=[shared.name], root_cause="hang")
    for incident in (first, second):
        lifecycle.mark_suspects(
            session, incident=incident, names=[s["node"] for s in incident.suspects], now=now, settings=settings
        )
    resolve(session, incident=first, resolution="no new evidence", now=now)
    assert (lone.state, shared.state) == ("healthy", "suspect")
    assert _events(session, lone)[-1] == ("cleared", "suspect", "healthy")


def test_manual_cordon_tells_schedulers_and_is_idempotent(client, session, make_token) -> None:
    operator = make_token("operator", name="bob")
    node = rows.node(session)
    response = client.post(
        f"/api/v1/nodes/{node.name}/cordon", json={"reason": "fans failing"}, headers=bearer(operator)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["state_reason"]) == ("cordoned", "fans failing")
    assert body["history"][0]["kind"] == "cordon" and body["history"][0]["actor"] == "operator:bob"
    again = client.post(f"/api/v1/nodes/{node.name}/cordon", json={"reason": "again"}, headers=bearer(operator))
    assert again.status_code == 200
    decisions = session.scalars(select(Decision).where(Decision.node_id == node.id)).all()
    assert [(d.kind, d.state, d.incident_id) for d in decisions] == [("cordon", "pending", None)]

    scheduler = make_token("scheduler")
    pending = client.get("/api/v1/decisions?state=pending&kind=cordon", headers=bearer(scheduler)).json()["items"]
    assert [(d["node"], d["job_id"]) for d in pending] == [(node.name, None)]
    assert (
        client.post(f"/api/v1/nodes/{node.name}/cordon", json={"reason": "x"}, headers=bearer(scheduler)).status_code
        == 403
    )
    missing = client.post("/api/v1/nodes/no-such-node/cordon", json={"reason": "x"}, headers=bearer(operator))
    assert missing.status_code == 404


def test_return_respects_quarantine_and_passing_diagnostics_make_the_node_healthy(client, session, make_token) -> None:
    operator = make_token("operator")
    now = datetime.now(UTC)
    node = rows.node(session, state="evicted", lemon=True, quarantined_until=now + timedelta(days=7))
    url = f"/api/v1/nodes/{node.name}/return"

    early = client.post(url, json={"reason": "fixed"}, headers=bearer(operator))
    assert early.status_code == 409 and "quarantined until" in early.json()["message"]
    node.quarantined_until = now - timedelta(seconds=1)
    session.flush()
    failed = {"reason": "fixed", "diagnostics": {"passed": False, "tool": "dcgmi diag -r 3"}}
    assert client.post(url, json=failed, headers=bearer(operator)).status_code == 409
    session.expire_all()
    assert session.get_one(Node, node.id).state == "evicted"

    passed = {"reason": "GPU 3 replaced", "diagnostics": {"passed": True, "tool": "dcgmi diag -r 3", "report": "ok"}}
    response = client.post(url, json=passed, headers=bearer(operator))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "healthy" and body["lemon"] and body["quarantined_until"] is None
    assert body["history"][0]["details"]["diagnostics"]["tool"] == "dcgmi diag -r 3"
    assert (body["history"][0]["kind"], body["history"][0]["source"]) == ("return", "person")
    decision = session.scalars(select(Decision).where(Decision.node_id == node.id)).one()
    assert (decision.kind, decision.state) == ("return", "pending")


def test_a_lemon_suspect_returns_only_with_passing_diagnostics(client, session, make_token) -> None:
    operator = make_token("operator")
    node = rows.node(session, state="suspect", lemon=True)
    refused = client.post(f"/api/v1/nodes/{node.name}/return", json={"reason": "fine"}, headers=bearer(operator))
    assert refused.status_code == 409 and "needs a passing diagnostics report" in refused.json()["message"]


def test_force_returns_a_quarantined_node_and_says_so_in_its_history(client, session, make_token) -> None:
    operator = make_token("operator")
    node = rows.node(session, state="evicted", quarantined_until=datetime.now(UTC) + timedelta(hours=1))
    response = client.post(
        f"/api/v1/nodes/{node.name}/return", json={"reason": "spare needed", "force": True}, headers=bearer(operator)
    )
    assert response.status_code == 200
    assert response.json()["state"] == "healthy"
    assert response.json()["history"][0]["kind"] == "return_forced"


def test_repair_then_return_runs_the_gate_and_its_pass_supersedes_the_pending_cordon(
    client, session, make_token
) -> None:
    client.app.state.directives.max_age = 0.0
    operator, agent = bearer(make_token("operator")), bearer(make_token("agent"))
    client.post("/api/v1/ingest", json=batch("repaired", job_id=None), headers=agent)
    node = session.scalar(select(Node).where(Node.name == "repaired"))
    client.post(f"/api/v1/nodes/{node.name}/cordon", json={"reason": "flaky"}, headers=operator)
    repair = client.post(f"/api/v1/nodes/{node.name}/repair", json={"reason": "RMA 881"}, headers=operator)
    assert repair.json()["state"] == "in_repair"
    back = client.post(f"/api/v1/nodes/{node.name}/return", json={"reason": "repaired"}, headers=operator)
    assert back.json()["state"] == "returning"
    # The scheduler still holds it out: its agent runs the full suite first, and only a pass gives it back.
    [directive] = client.post("/api/v1/ingest", json=batch("repaired", job_id=None), headers=agent).json()["directives"]
    assert (directive["kind"], directive["level"], directive["force"]) == ("run_checks", 2, False)
    assert directive["return_on_pass"] is True and directive["undrain"] is True
    assert session.scalars(select(Decision).where(Decision.node_id == node.id, Decision.kind == "return")).all() == []

    payload = batch("repaired", job_id=None, metrics=[], logs=[], processes=[])
    payload["checks"] = [
        {"ts": datetime.now(UTC).isoformat(), "directive_id": directive["id"], "check": c, "subject": "gpu:0",
         "status": "pass"}
        for c in ("nvml_state", "gemm_bf16")
    ]  # fmt: skip
    assert client.post("/api/v1/ingest", json=payload, headers=agent).status_code == 200
    session.expire_all()
    assert session.get_one(Node, node.id).state == "healthy"
    decisions = {
        d.kind: (d.state, d.outcome_message)
        for d in session.scalars(select(Decision).where(Decision.node_id == node.id))
    }
    assert decisions["cordon"][0] == "rejected" and decisions["cordon"][1].startswith("superseded")
    assert decisions["return"] == ("pending", None)
    assert [(k, s) for k, _, s, _ in _sourced(session, node)] == [
        ("cordon", "person"),
        ("repair", "person"),
        ("return", "person"),
        ("gate_passed", "checks"),
    ]
    healthy = client.post(f"/api/v1/nodes/{node.name}/repair", json={"reason": "x"}, headers=operator)
    assert healthy.status_code == 409


def _sourced(session, node: Node) -> list[tuple[str, str | None, str, str | None]]:  # type: ignore[no-untyped-def]
    """(kind, from state, source, to state) of the node's history, oldest first."""
    return [
        (e.kind, e.from_state, e.source, e.to_state)
        for e in session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id).order_by(NodeEvent.id))
    ]


def test_list_and_describe_nodes(client, session, make_token) -> None:
    token = make_token("scheduler")
    healthy, suspect = rows.node(session), rows.node(session, state="suspect")
    job = rows.job(session)
    rows.incident(session, job=job, suspects=[suspect.name], state="open")
    page = client.get("/api/v1/nodes?state=suspect", headers=bearer(token)).json()
    assert suspect.name in [n["name"] for n in page["items"]] and healthy.name not in [n["name"] for n in page["items"]]

    detail = client.get(f"/api/v1/nodes/{suspect.name}", headers=bearer(token)).json()
    assert [(i["job_id"], i["root_cause"], i["confidence"]) for i in detail["open_incidents"]] == [
        (job.external_id, "gpu_hardware", 0.95)
    ]
    assert client.get("/api/v1/nodes/none-such", headers=bearer(token)).status_code == 404
    assert client.get("/api/v1/nodes?state=broken", headers=bearer(token)).status_code == 422


def test_node_pages_follow_the_cursor_to_the_end(client, session, make_token) -> None:
    token = make_token("scheduler")
    made = {rows.node(session).name for _ in range(5)}
    seen: list[str] = []
    url = "/api/v1/nodes?limit=2"
    while url:
        page = client.get(url, headers=bearer(token)).json()
        seen += [n["name"] for n in page["items"]]
        url = f"/api/v1/nodes?limit=2&cursor={page['next_cursor']}" if page["next_cursor"] else ""
    assert made <= set(seen) and len(seen) == len(set(seen))


def test_a_return_supersedes_a_pending_gpu_reset(client, session, make_token) -> None:
    operator = make_token("operator", name="oncall")
    node = rows.node(session)
    incident = rows.incident(session, job=rows.job(session), suspects=[node.name])
    reset = rows.decision(session, incident=incident, node=node, kind="reset_gpu", gpu=3)
    client.post(f"/api/v1/nodes/{node.name}/cordon", json={"reason": "checking GPU 3"}, headers=bearer(operator))
    session.refresh(reset)
    assert reset.state == "pending"  # a cordon leaves the reset to be done on the cordoned node
    body = {"reason": "GPU 3 reset", "diagnostics": {"passed": True, "tool": "nvidia-smi -q"}}
    back = client.post(f"/api/v1/nodes/{node.name}/return", json=body, headers=bearer(operator))
    assert back.status_code == 200, back.text
    session.refresh(reset)
    assert (reset.state, reset.outcome_message) == ("rejected", "superseded: return by operator:oncall")


def test_an_evicted_node_leaves_its_job(session) -> None:
    """Its agent's samples were still the job's while it sat in repair (its dead GPU's counters climbing), and the
    job accused it again when it came back."""
    from service.decisions.lifecycle import acknowledge
    from service.jobs import service as jobs

    job, node, _, decision = rows.eviction(session)
    node.current_job_id = job.id  # its agent said it ran the job
    session.flush()
    assert node.id in jobs.node_ids(session, job=job)
    acknowledge(
        session, decision_id=decision.id, outcome="done", message="evicted", actor="test", now=datetime.now(UTC),
        settings=get_settings(),
    )  # fmt: skip
    assert node.state == "evicted" and node.current_job_id is None
    assert node.id not in jobs.node_ids(session, job=job)
