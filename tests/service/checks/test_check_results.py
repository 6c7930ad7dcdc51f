"""Stop-time check results through POST /api/v1/ingest: stored with the service's verdict (the fleet's, or the
spec floor's), a failure as a finding, bad items refused whole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.models import CheckResult, Finding, Node
from tests.conftest import bearer, count
from tests.factories import batch

H100 = "NVIDIA H100 80GB HBM3"
GEMM = 797.51  # measured bf16 TFLOPS of one H100 (tests/fixtures/checks/README.md)


@pytest.fixture
def agent(make_token) -> dict[str, str]:
    return bearer(make_token("agent"))


def _item(check: str, subject: str, status: str | None = "pass", **extra: Any) -> dict[str, Any]:
    item = {"ts": datetime.now(UTC).isoformat(), "directive_id": "d-1", "check": check, "subject": subject}
    if status is not None:
        item["status"] = status
    return {**item, **extra}


def _send(client, agent, node: str, items: list[dict[str, Any]]) -> Any:
    payload = batch(node, job_id=None, metrics=[], logs=[], processes=[])
    payload["checks"] = items
    return client.post("/api/v1/ingest", json=payload, headers=agent)


def _rows(session, node: str) -> dict[tuple[str, str], CheckResult]:
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    rows = session.scalars(select(CheckResult).where(CheckResult.node_id == node_id)).all()
    return {(r.check, r.subject): r for r in rows}


def _seed_fleet(session, values: list[float]) -> None:
    node = Node(name="fleet-history")
    session.add(node)
    session.flush()
    start = datetime.now(UTC) - timedelta(days=2)
    session.add_all(
        CheckResult(
            node_id=node.id,
            batch_id="00000000-0000-0000-0000-000000000001",
            ts=start + timedelta(minutes=i),
            check="gemm_bf16",
            subject=f"gpu:{i % 8}",
            gpu_model=H100,
            status="pass",
            verdict="pass",
            basis="fleet",
            measured=v,
            unit="TFLOPS",
            evidence={},
        )
        for i, v in enumerate(values)
    )
    session.flush()


def test_results_are_stored_and_a_failing_check_becomes_a_finding_on_its_gpu(client, session, agent):
    items = [
        _item("nvml_state", "gpu:0", measured=0, expected=0, unit="problems", evidence={"model": H100}),
        _item(
            "nvml_state",
            "gpu:1",
            "fail",
            measured=1,
            expected=0,
            unit="problems",
            evidence={"model": H100, "problems": ["row remap pending: 1"], "action": "reset_gpu"},
        ),
        _item("ib_port", "ib:mlx5_0/1", "not_available", evidence={"reason": "no port"}),
    ]
    answer = _send(client, agent, "n1", items)
    assert answer.status_code == 200, answer.text
    rows = _rows(session, "n1")
    assert rows[("nvml_state", "gpu:0")].verdict == "pass" and rows[("nvml_state", "gpu:0")].basis == "agent"
    failed = rows[("nvml_state", "gpu:1")]
    assert failed.verdict == "fail" and failed.gpu_model == H100
    finding = session.get(Finding, failed.finding_id)
    assert (finding.detector, finding.category, finding.subject_kind, finding.subject) == (
        "stop_checks",
        "gpu_hardware",
        "gpu",
        "n1/1",
    )
    assert finding.summary == "check nvml_state failed on n1 GPU 1: row remap pending: 1"
    assert finding.action == "evict" and finding.evidence["details"]["action"] == "reset_gpu"
    assert rows[("ib_port", "ib:mlx5_0/1")].verdict == "not_available"
    assert count(session, "findings") == 1


def test_a_gpu_20_percent_below_the_fleet_s_gemm_median_fails_and_a_median_one_passes(client, session, agent):
    _seed_fleet(session, [GEMM * (1 + 0.01 * ((i % 7) - 3)) for i in range(60)])
    items = [
        _item("gemm_bf16", "gpu:0", measured=GEMM, unit="TFLOPS", evidence={"model": H100}),
        _item("gemm_bf16", "gpu:1", measured=0.8 * GEMM, unit="TFLOPS", evidence={"model": H100}),
    ]
    assert _send(client, agent, "suspect", items).status_code == 200
    rows = _rows(session, "suspect")
    healthy, slow = rows[("gemm_bf16", "gpu:0")], rows[("gemm_bf16", "gpu:1")]
    assert healthy.verdict == "pass" and healthy.basis == "fleet" and healthy.finding_id is None
    assert slow.status == "pass" and slow.verdict == "fail" and slow.basis == "fleet"  # the agent alone passed it
    assert slow.evidence["fleet"]["history"] == 60 and slow.evidence["fleet"]["shortfall"] == pytest.approx(
        0.2, abs=0.01
    )
    finding = session.get(Finding, slow.finding_id)
    assert finding.subject == "suspect/1" and "below" in finding.summary


def test_without_enough_history_the_spec_floor_judges(client, session, agent):
    items = [
        _item("gemm_bf16", "gpu:0", measured=0.8 * GEMM, unit="TFLOPS", evidence={"model": H100}),
        _item("gemm_bf16", "gpu:1", measured=300.0, unit="TFLOPS", evidence={"model": H100}),
        _item("gemm_bf16", "gpu:2", measured=300.0, unit="TFLOPS", evidence={"model": "Some Future GPU"}),
    ]
    assert _send(client, agent, "new-fleet", items).status_code == 200
    rows = _rows(session, "new-fleet")
    assert (rows[("gemm_bf16", "gpu:0")].verdict, rows[("gemm_bf16", "gpu:0")].basis) == ("pass", "spec")
    assert (rows[("gemm_bf16", "gpu:1")].verdict, rows[("gemm_bf16", "gpu:1")].cutoff) == ("fail", 494.5)
    assert (rows[("gemm_bf16", "gpu:2")].verdict, rows[("gemm_bf16", "gpu:2")].basis) == ("pass", "agent")


def test_a_refused_suite_is_stored_with_its_reason(client, session, agent):
    refused = {"ts": datetime.now(UTC).isoformat(), "directive_id": "d-9", "refused": "2 training processes run"}
    assert _send(client, agent, "busy", [refused]).status_code == 200
    [row] = _rows(session, "busy").values()
    assert (row.check, row.status, row.verdict, row.evidence["reason"]) == (
        "suite",
        "refused",
        "refused",
        "2 training processes run",
    )


@pytest.mark.parametrize(
    "bad",
    [
        _item("gemm_bf16", "gpu:0", "maybe"),
        {**_item("gemm_bf16", "gpu:0"), "refused": "and also refused"},
        _item("gemm_bf16", "gpu:0", None),
        {**_item("gemm_bf16", "gpu:0"), "check": None},
        _item("gemm_bf16", "gpu:0", duration_s=-1),
    ],
)
def test_a_bad_check_item_refuses_the_whole_batch(client, session, agent, bad):
    answer = _send(client, agent, "n1", [_item("nvml_state", "gpu:0"), bad])
    assert answer.status_code == 422, answer.text
    assert count(session, "check_results") == 0 and count(session, "agent_batches") == 0


# -- asking a node's agent for the checks ------------------------------------------------------------


def _fresh(client) -> None:
    client.app.state.directives.max_age = 0.0  # the per-process cache would hide a new request for a second


def test_a_run_checks_request_reaches_the_node_s_agent_only_and_its_results_are_read_back(
    client, session, agent, make_token
):
    _fresh(client)
    operator = bearer(make_token("operator", name="alice"))
    for node in ("suspect", "other"):
        assert client.post("/api/v1/ingest", json=batch(node), headers=agent).status_code == 200
    created = client.post("/api/v1/nodes/suspect/checks", json={"level": 2, "reason": "diagnose"}, headers=operator)
    assert created.status_code == 201, created.text
    [directive] = created.json()["directives"]
    assert (directive["node"], directive["kind"], directive["params"]) == (
        "suspect",
        "run_checks",
        {"level": 2, "force": False},
    )
    answer = client.post("/api/v1/ingest", json=batch("suspect"), headers=agent).json()
    assert answer["directives"] == [{"id": directive["id"], "kind": "run_checks", "level": 2, "force": False}]
    assert client.post("/api/v1/ingest", json=batch("other"), headers=agent).json()["directives"] == []

    items = [
        _item("nvml_state", "gpu:0", directive_id=directive["id"]),
        _item("nvml_state", "gpu:1", directive_id="old"),
    ]
    assert _send(client, agent, "suspect", items).status_code == 200
    read = client.get(f"/api/v1/nodes/suspect/checks?directive_id={directive['id']}", headers=operator).json()
    assert [(r["check"], r["subject"], r["verdict"]) for r in read["results"]] == [("nvml_state", "gpu:0", "pass")]
    assert len(client.get("/api/v1/nodes/suspect/checks", headers=operator).json()["results"]) == 2


def test_a_level_3_request_with_a_peer_pairs_the_two_agents(client, session, agent, make_token):
    _fresh(client)
    operator = bearer(make_token("operator"))
    for node in ("suspect", "good-1"):
        client.post("/api/v1/ingest", json=batch(node), headers=agent)
    created = client.post("/api/v1/nodes/suspect/checks", json={"level": 3, "peer": "good-1"}, headers=operator)
    assert created.status_code == 201, created.text
    mine, theirs = created.json()["directives"]
    assert theirs["node"] == "good-1" and theirs["params"]["only"] == ["allreduce_peer"]
    assert mine["params"]["peer"]["addr"] == theirs["params"]["peer"]["addr"] == "good-1"
    assert mine["params"]["peer"]["port"] == theirs["params"]["peer"]["port"]
    assert (mine["params"]["peer"]["node_rank"], theirs["params"]["peer"]["node_rank"]) == (1, 0)
    [delivered] = client.post("/api/v1/ingest", json=batch("good-1"), headers=agent).json()["directives"]
    assert delivered["id"] == theirs["id"] and delivered["level"] == 3 and delivered["peer"]["node_rank"] == 0


@pytest.mark.parametrize(
    ("node", "body", "code"),
    [
        ("nowhere", {}, 404),
        ("suspect", {"level": 3, "peer": "nowhere"}, 404),
        ("suspect", {"level": 2, "peer": "good-1"}, 422),
        ("suspect", {"level": 3, "peer": "suspect"}, 422),
        ("suspect", {"level": 4}, 422),
        ("suspect", {"level": 2, "shell": "rm -rf /"}, 422),
    ],
)
def test_a_bad_request_for_checks_is_refused_and_asks_nothing(client, session, agent, make_token, node, body, code):
    operator = bearer(make_token("operator"))
    for name in ("suspect", "good-1"):
        client.post("/api/v1/ingest", json=batch(name), headers=agent)
    answer = client.post(f"/api/v1/nodes/{node}/checks", json=body, headers=operator)
    assert answer.status_code == code, answer.text
    assert count(session, "directives") == 0


def test_only_operators_ask_for_checks(client, session, agent, make_token):
    client.post("/api/v1/ingest", json=batch("suspect"), headers=agent)
    scheduler = bearer(make_token("scheduler"))
    assert client.post("/api/v1/nodes/suspect/checks", json={}, headers=scheduler).status_code == 403
    assert client.get("/api/v1/nodes/suspect/checks", headers=scheduler).status_code == 200
