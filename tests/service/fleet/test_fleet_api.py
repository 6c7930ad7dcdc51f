"""Repair times and spare-capacity advice over stored incidents, decisions and node histories (hand-computed)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from ml.demarcation import IncidentProposal, Suspect
from service.config import get_settings
from service.decisions.service import decide_incident
from service.incidents.service import apply_proposals
from service.models import Decision, Finding, Incident, NodeEvent
from tests import rows
from tests.conftest import bearer
from tests.service.fleet import history


def _stage(group: dict, stage: str) -> tuple:
    s = group["stages"][stage]
    return s["count"], s["p50_s"], s["p90_s"]


def test_fleet_repair_times_match_a_hand_computation(client, session, make_token) -> None:
    history.build(session)
    token = make_token("scheduler")
    body = client.get("/api/v1/repair-times?window=7d", headers=bearer(token)).json()
    assert body["by"] == "fleet" and body["incidents"] == 3 and body["window_s"] == 7 * 86400
    (fleet,) = body["groups"]
    assert _stage(fleet, "detect") == (3, 12, pytest.approx(34.4))
    assert _stage(fleet, "decide") == (3, 8, pytest.approx(49.6))
    assert _stage(fleet, "act") == (3, 30, pytest.approx(54))
    assert _stage(fleet, "return") == (2, 1200, pytest.approx(1680))

    causes = {
        g["key"]: g for g in client.get("/api/v1/repair-times?by=root_cause", headers=bearer(token)).json()["groups"]
    }
    assert set(causes) == {"gpu_hardware", "network"}
    assert _stage(causes["gpu_hardware"], "detect") == (2, 7, pytest.approx(11))
    assert _stage(causes["network"], "return") == (1, 600, 600)

    nodes = client.get("/api/v1/repair-times?by=node&window=30d", headers=bearer(token)).json()["groups"]
    assert [g["key"] for g in nodes] == ["n1", "n2", "n3"]
    assert nodes[0]["incidents"] == 2 and _stage(nodes[0], "act") == (2, 35, pytest.approx(55))

    # Only incident c opened in the last three hours.
    recent = client.get("/api/v1/repair-times?window=3h", headers=bearer(token)).json()
    assert recent["incidents"] == 1 and _stage(recent["groups"][0], "detect") == (1, 2, 2)


def test_one_incident_s_repair_times(client, session, make_token) -> None:
    h = history.build(session)
    token = make_token("operator")
    b = client.get(f"/api/v1/incidents/{h.incidents['b'].id}/repair-times", headers=bearer(token)).json()
    assert (b["detect_s"], b["decide_s"], b["act_s"], b["return_s"]) == (40, 60, 30, 600)
    assert [(o["node"], o["seconds"]) for o in b["outages"]] == [("n2", 600)]
    c = client.get(f"/api/v1/incidents/{h.incidents['c'].id}/repair-times", headers=bearer(token)).json()
    assert c["act_s"] == 10 and c["return_s"] is None and c["outages"][0]["back_at"] is None
    missing = client.get("/api/v1/incidents/999999999/repair-times", headers=bearer(token))
    assert missing.status_code == 404


@pytest.mark.parametrize(
    "query",
    ["window=7", "window=0d", "window=-1h", "window=400d", "window=7w", "window=abc", "by=gpu"],
)
def test_bad_windows_and_groupings_are_refused(client, make_token, query: str) -> None:
    response = client.get(f"/api/v1/repair-times?{query}", headers=bearer(make_token("scheduler")))
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid"


def test_repair_times_need_a_token(client) -> None:
    assert client.get("/api/v1/repair-times").status_code == 401


def _cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_job_spares_from_the_fleet_failure_rate(client, session, make_token) -> None:
    history.build(session)
    token = make_token("scheduler")
    body = client.get("/api/v1/jobs/llm-repair/spares?horizon=24h&quantile=0.99", headers=bearer(token)).json()
    # 3 failures in 720 node-hours; p = 1 - exp(-24 * 3 / 720) = 0.0951626 for each of the job's 3 nodes.
    assert body["nodes"] == 3 and body["failures"] == 3
    assert body["node_hours"] == pytest.approx(720, rel=1e-4)
    assert body["rate_per_1000_node_hours"] == pytest.approx(1000 * 3 / 720, rel=1e-4)
    assert body["p_node"] == pytest.approx(0.0951626, rel=1e-4)
    assert body["standbys"] == 2 and body["reason"] is None
    assert body["by_root_cause_per_1000_node_hours"] == pytest.approx(
        {"gpu_hardware": 2000 / 720, "network": 1000 / 720}, rel=1e-4
    )

    big = client.get("/api/v1/spares?nodes=64&horizon=24h", headers=bearer(token)).json()
    expected = next(s for s in range(65) if _cdf(s, 64, big["p_node"]) >= 0.99)
    assert big["standbys"] == expected == 12
    # A week ahead needs more.
    week = client.get("/api/v1/spares?nodes=64&horizon=7d", headers=bearer(token)).json()
    assert week["standbys"] > big["standbys"]


def test_spares_without_history_say_so(client, session, make_token) -> None:
    token = make_token("scheduler")
    body = client.get("/api/v1/spares?nodes=64", headers=bearer(token)).json()
    assert body["standbys"] is None and "no node has been observed" in body["reason"]
    rows.node(session)
    quiet = client.get("/api/v1/spares?nodes=64", headers=bearer(token)).json()
    assert quiet["standbys"] is None and "too little history" in quiet["reason"]  # a node seen for moments
    job = rows.job(session)
    placed = client.get(f"/api/v1/jobs/{job.external_id}/spares", headers=bearer(token))
    assert placed.status_code == 409 and "pass nodes=N" in placed.json()["message"]
    assert client.get(f"/api/v1/jobs/{job.external_id}/spares?nodes=8", headers=bearer(token)).status_code == 200
    assert client.get("/api/v1/jobs/no-such-job/spares", headers=bearer(token)).status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "nodes=8&horizon=0h",
        "nodes=8&horizon=24",
        "nodes=8&horizon=500d",
        "nodes=8&quantile=1",
        "nodes=8&quantile=0",
        "nodes=0",
        "horizon=24h",
        "nodes=8&window=1y",
    ],
)
def test_bad_spares_queries_are_refused(client, make_token, query: str) -> None:
    response = client.get(f"/api/v1/spares?{query}", headers=bearer(make_token("scheduler")))
    assert response.status_code == 422, response.text


def _count(client, stage: str) -> float:
    text = client.get("/metrics").text
    match = re.search(rf'^faultline_repair_seconds_count{{stage="{stage}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_metrics_observe_act_and_return_as_they_complete(client, session, make_token) -> None:
    _, node, incident, decision = rows.eviction(session)
    decision.created_at = datetime.now(UTC) - timedelta(seconds=45)
    session.flush()
    acts, returns = _count(client, "act"), _count(client, "return")
    ack = client.post(
        f"/api/v1/decisions/{decision.id}/ack", json={"outcome": "done"}, headers=bearer(make_token("scheduler"))
    )
    assert ack.status_code == 200, ack.text
    assert _count(client, "act") == acts + 1
    # The eviction is recorded against the incident; the return completes the stage.
    assert session.scalars(select(NodeEvent.to_state).where(NodeEvent.node_id == node.id)).all() == ["evicted"]
    back = client.post(
        f"/api/v1/nodes/{node.name}/return",
        json={"reason": "fixed", "force": True},
        headers=bearer(make_token("operator")),
    )
    assert back.status_code == 200, back.text
    assert _count(client, "return") == returns + 1
    text = client.get("/metrics").text
    assert 'faultline_repair_seconds_bucket{le="60.0",stage="act"}' in text
    times = client.get(f"/api/v1/incidents/{incident.id}/repair-times", headers=bearer(make_token("scheduler"))).json()
    assert times["act_s"] == pytest.approx(45, abs=5) and times["return_s"] is not None
    session.expire_all()
    assert session.get_one(Incident, incident.id).state == "resolved"
    assert session.get_one(Decision, decision.id).state == "done"


def test_metrics_observe_detect_when_an_incident_opens_and_decide_at_its_first_decision(client, session) -> None:
    job, node, now = rows.job(session), rows.node(session), datetime.now(UTC)
    finding = Finding(
        dedup_key="fleet-metrics",
        job_id=job.id,
        node_id=node.id,
        detector="xid",
        category="gpu_hardware",
        subject_kind="node",
        subject=node.name,
        confidence=0.95,
        summary="Xid 79",
        evidence={},
        observed_at=now - timedelta(seconds=30),
    )
    session.add(finding)
    session.flush()
    suspect = Suspect(node=node.name, confidence=0.95, action="evict", finding_ids=(finding.id,), reason="Xid 79")
    proposal = IncidentProposal(
        root_cause="gpu_hardware",
        blame="infrastructure",
        confidence=0.95,
        severity="critical",
        summary="Xid 79",
        finding_ids=[finding.id],
        suspects=[suspect],
    )
    detects, decides = _count(client, "detect"), _count(client, "decide")
    applied = apply_proposals(session, job=job, proposals=[proposal], fresh={finding.id}, now=now)
    assert _count(client, "detect") == detects + 1
    # The same incident again (the next diagnosis pass) opens nothing.
    apply_proposals(session, job=job, proposals=[proposal], fresh={finding.id}, now=now)
    assert _count(client, "detect") == detects + 1

    incident, settings = applied.incidents[0], get_settings()
    assert decide_incident(session, job=job, incident=incident, proposal=proposal, now=now, settings=settings)
    assert _count(client, "decide") == decides + 1
    # Deciding again stores nothing new and is no first decision.
    decide_incident(session, job=job, incident=incident, proposal=proposal, now=now, settings=settings)
    assert _count(client, "decide") == decides + 1


def test_metrics_show_the_last_day_s_repair_times_read_from_the_database(client, session) -> None:
    assert "faultline_repair_window_samples" in client.get("/metrics").text
    history.build(session)
    client.app.state.repair_gauges.clear()  # the gauges are cached for a few seconds
    text = client.get("/metrics").text
    # The same hand-computed values as the API's (all three incidents opened within the last day).
    assert 'faultline_repair_window_seconds{quantile="0.5",stage="detect"} 12.0' in text
    assert 'faultline_repair_window_seconds{quantile="0.9",stage="act"} 54.0' in text
    assert 'faultline_repair_window_seconds{quantile="0.5",stage="return"} 1200.0' in text
    assert 'faultline_repair_window_samples{stage="return"} 2.0' in text
