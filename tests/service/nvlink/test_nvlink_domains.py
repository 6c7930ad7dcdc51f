"""NVLink domains: the fabric the agents report, stored and shown; the domain check and the scheduler API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Decision, Finding, Node, SharedIncident
from service.nvlink import service as nvlink
from tests.conftest import bearer
from tests.factories import batch

DOMAIN = "6a7c1f3e-2b5d-4e8f-9a01-3c4d5e6f7a8b"
OTHER = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"


def _fabric(cluster: str = DOMAIN, **over: Any) -> dict[str, Any]:
    return {
        "cluster_uuid": cluster,
        "clique_id": 32766,
        "state": "completed",
        "status": 0,
        "health": "healthy",
        "degraded_bw": False,
        "gfm": "connected",
    } | over


def _tray(name: str, *, cluster: str = DOMAIN, job: str | None = "nvl-job", **over: Any) -> dict[str, Any]:
    payload = batch(name, gpus=4, job_id=job)
    payload["logs"] = []
    tray = int(name.rsplit("-", 1)[1])
    for proc in payload["processes"]:  # tray N runs ranks 4N..4N+3 of a 72-rank job
        proc["rank"], proc["world_size"], proc["pid"] = 4 * tray + proc["local_rank"], 72, 4000 + proc["local_rank"]
    for gpu in payload["heartbeat"]["gpus"]:
        gpu["fabric"] = _fabric(cluster, **over)
    payload["heartbeat"]["host"] = {"driver_version": "570.133.20", "kernel": "6.8.0-1017-nvidia"}
    return payload


@pytest.fixture
def agent(make_token) -> dict[str, str]:
    return bearer(make_token("agent"))


@pytest.fixture
def scheduler(make_token) -> dict[str, str]:
    return bearer(make_token("scheduler"))


def _send(client, agent, payloads: list[dict[str, Any]]) -> None:
    for payload in payloads:
        response = client.post("/api/v1/ingest", json=payload, headers=agent)
        assert response.status_code == 200, response.text


def test_fabric_is_stored_per_gpu_and_nodes_and_jobs_show_their_domain(client, session, agent, scheduler) -> None:
    _send(client, agent, [_tray(f"tray-{i:02d}") for i in range(3)] + [_tray("other-01", cluster=OTHER, job=None)])
    rows = session.execute(
        text(
            "SELECT n.name, g.index, g.fabric_cluster_uuid, g.fabric_clique_id, g.fabric_state, g.fabric_health, "
            "g.fabric_at IS NOT NULL AS dated FROM gpus g JOIN nodes n ON n.id = g.node_id ORDER BY 1, 2"
        )
    ).all()
    assert len(rows) == 16
    stored = {
        (r.name, r.fabric_cluster_uuid, r.fabric_clique_id, r.fabric_state, r.fabric_health, r.dated) for r in rows
    }
    assert stored == {
        *((f"tray-{i:02d}", DOMAIN, 32766, "completed", "healthy", True) for i in range(3)),
        ("other-01", OTHER, 32766, "completed", "healthy", True),
    }
    labels = session.scalar(select(Node.labels).where(Node.name == "tray-01"))
    assert labels is not None and (labels["nvlink_domain"], labels["nvlink_clique"]) == (DOMAIN, "32766")
    node = client.get("/api/v1/nodes/tray-01", headers=scheduler).json()
    assert (node["nvlink_domain"], node["nvlink_clique"]) == (DOMAIN, "32766")
    assert node["gpu_list"][0]["fabric_cluster_uuid"] == DOMAIN and node["gpu_list"][0]["fabric_state"] == "completed"
    listed = client.get("/api/v1/nodes", headers=scheduler).json()["items"]
    assert {n["name"]: n["nvlink_domain"] for n in listed}["other-01"] == OTHER
    job = client.get("/api/v1/jobs/nvl-job", headers=scheduler).json()
    assert job["nvlink_domains"] == {DOMAIN: ["tray-00", "tray-01", "tray-02"]}
    domains = client.get("/api/v1/nvlink-domains", headers=scheduler).json()["items"]
    # In cluster UUID order.
    assert [(d["cluster_uuid"], d["state"], d["healthy"]) for d in domains] == [
        (OTHER, "healthy", True),
        (DOMAIN, "healthy", True),
    ]
    one = client.get(f"/api/v1/nvlink-domains/{DOMAIN}", headers=scheduler).json()
    assert one["usable_nodes"] == ["tray-00", "tray-01", "tray-02"]
    assert one["cliques"] == [{"clique_id": 32766, "nodes": ["tray-00", "tray-01", "tray-02"]}]
    assert [n["gpus"] for n in one["nodes"]] == [4, 4, 4] and one["shared_incident_id"] is None


def test_a_node_that_leaves_the_fabric_loses_its_domain_labels(client, session, agent) -> None:
    _send(client, agent, [_tray("tray-00")])
    plain = batch("tray-00", gpus=4)
    plain["heartbeat"]["host"] = {"driver_version": "570.133.20", "fabric_manager": "running"}
    _send(client, agent, [plain])
    labels = session.scalar(select(Node.labels).where(Node.name == "tray-00"))
    assert labels is not None and labels["fabric_manager"] == "running"
    assert "nvlink_domain" not in labels and "nvlink_clique" not in labels
    assert session.scalar(text("SELECT count(*) FROM gpus WHERE fabric_cluster_uuid IS NOT NULL")) == 0


def test_bad_fabric_input_is_422_and_bad_domain_ids_are_refused(client, session, agent, scheduler) -> None:
    payload = _tray("tray-00")
    payload["heartbeat"]["gpus"][0]["fabric"]["clique_id"] = -1
    response = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert response.status_code == 422 and "clique_id" in response.text
    assert session.scalar(text("SELECT count(*) FROM nodes")) == 0
    response = client.get("/api/v1/nvlink-domains/not-a-uuid", headers=scheduler)
    assert response.status_code == 422 and "not a fabric cluster UUID" in response.json()["message"]
    response = client.get(f"/api/v1/nvlink-domains/{OTHER}", headers=scheduler)
    assert response.status_code == 404
    assert client.get("/api/v1/nvlink-domains").status_code == 401


def _finding(session: Session, node: str, now: datetime, key: str) -> None:
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    session.add(
        Finding(
            dedup_key=key,
            node_id=node_id,
            detector="signatures",
            category="nvlink",
            subject_kind="node",
            subject=node,
            confidence=0.9,
            summary=f"NVLink errors on {node}",
            evidence={},
            observed_at=now,
        )
    )
    session.flush()


def test_trouble_on_several_trays_opens_one_domain_incident_that_cordons_the_domain(client, session, agent) -> None:
    trays = [_tray(f"tray-{i:02d}") for i in range(6)]
    for payload in trays[:3]:  # a switch tray gone: the trays' fabric bandwidth degraded
        for gpu in payload["heartbeat"]["gpus"]:
            gpu["fabric"] |= {"degraded_bw": True, "health": "limited_capacity"}
    _send(client, agent, [*trays, _tray("other-01", cluster=OTHER, job=None)])
    now = datetime.now(UTC)
    # Six trays of a seven-node fleet cordoned: past the fleet breaker's floor of 3 (its hold on a shared cause's
    # cordons: tests/service/shared_causes/test_shared_safety.py).
    settings = Settings(breaker_enabled=False)
    touched = nvlink.check(session, now=now, settings=settings)
    assert len(touched) == 1
    incident = touched[0]
    assert (incident.component_kind, incident.component, incident.state) == ("nvlink_domain", DOMAIN, "open")
    assert sorted(m["node"] for m in incident.members) == [f"tray-{i:02d}" for i in range(6)]
    assert sorted(incident.evidence["troubled_trays"]) == ["tray-00", "tray-01", "tray-02"]
    decisions = session.scalars(select(Decision).where(Decision.shared_incident_id == incident.id)).all()
    assert sorted(d.kind for d in decisions) == ["cordon"] * 6
    assert not session.scalars(select(Decision).where(Decision.kind == "evict")).all()
    # Idempotent: a second check opens nothing and cordons nothing more; the other domain is untouched.
    again = nvlink.check(session, now=now + timedelta(seconds=30), settings=settings)
    assert [i.id for i in again] == [incident.id]
    assert session.scalar(select(text("count(*)")).select_from(SharedIncident)) == 1
    assert len(session.scalars(select(Decision).where(Decision.kind == "cordon")).all()) == 6
    states = dict(session.execute(select(Node.name, Node.state)).all())
    assert states["other-01"] == "healthy" and {states[f"tray-{i:02d}"] for i in range(6)} == {"cordoned"}
    view = client.get(f"/api/v1/nvlink-domains/{DOMAIN}", headers=agent_scheduler(client, session)).json()
    assert (view["state"], view["healthy"], view["usable_nodes"], view["shared_incident_id"]) == (
        "failed",
        False,
        [],
        incident.id,
    )


def agent_scheduler(client, session) -> dict[str, str]:
    from service.tokens import service as tokens

    return bearer(tokens.create(session, scope="scheduler", node_name=None).token)


def test_nvlink_findings_on_one_tray_are_that_trays_own(client, session, agent) -> None:
    _send(client, agent, [_tray(f"tray-{i:02d}") for i in range(4)])
    now = datetime.now(UTC)
    _finding(session, "tray-02", now, "f1")
    assert nvlink.check(session, now=now, settings=Settings()) == []
    view = client.get(f"/api/v1/nvlink-domains/{DOMAIN}", headers=agent_scheduler(client, session)).json()
    assert (view["state"], view["healthy"]) == ("degraded", False)
    assert view["usable_nodes"] == ["tray-00", "tray-01", "tray-03"]
    assert [n["trouble"] for n in view["nodes"] if n["name"] == "tray-02"] == [["1 NVLink finding(s)"]]
    # A second tray's findings within the window: the switch side; older findings do not count.
    _finding(session, "tray-03", now - timedelta(seconds=Settings().nvlink_domain_window_s + 60), "f2")
    assert nvlink.check(session, now=now, settings=Settings()) == []
    _finding(session, "tray-00", now - timedelta(seconds=10), "f3")
    assert [i.component for i in nvlink.check(session, now=now, settings=Settings())] == [DOMAIN]


def test_the_fabric_manager_stopped_is_the_domains_failure(client, session, agent) -> None:
    trays = [_tray(f"tray-{i:02d}") for i in range(3)]
    trays[1]["heartbeat"]["host"]["fabric_manager"] = "stopped"
    _send(client, agent, trays)
    touched = nvlink.check(session, now=datetime.now(UTC), settings=Settings())
    assert len(touched) == 1 and "fabric manager stopped on tray-01" in touched[0].summary
    off = Settings(nvlink_domains_enabled=False)
    assert nvlink.check_nodes(session, node_names=["tray-00"], now=datetime.now(UTC), settings=off) == []


def test_the_node_and_job_pages_show_the_nvlink_domain(ui, client, agent) -> None:
    trays = [_tray(f"tray-{i:02d}") for i in range(2)]
    for gpu in trays[1]["heartbeat"]["gpus"][2:3]:
        gpu["fabric"] |= {"degraded_bw": True, "health": "unhealthy"}
    _send(client, agent, trays)
    page = ui.get("/nodes/tray-01").text
    section = page[page.index('id="node-nvlink"') :][:1500]
    assert DOMAIN in section and "clique 32766" in section
    assert "GPU 2 completed <b>unhealthy</b> <b>bandwidth degraded</b>" in section
    assert "GPU 0 completed," in section
    job = ui.get("/jobs/nvl-job").text
    line = job[job.index('id="job-nvlink"') :][:600]
    assert DOMAIN[:8] in line and "2 nodes" in line
    # A node in no domain shows none.
    _send(client, agent, [batch("plain-01", gpus=2, job_id=None)])
    assert 'id="node-nvlink"' not in ui.get("/nodes/plain-01").text


def test_a_trays_nvlink_findings_settle_briefly_only_in_a_domain(client, session, agent) -> None:
    _send(client, agent, [_tray("tray-00"), batch("plain-01", gpus=2, job_id=None)])
    now = datetime.now(UTC)
    settings = Settings()
    young, old = now - timedelta(seconds=3), now - timedelta(seconds=settings.nvlink_domain_settle_s + 1)
    found = [("tray-00", "nvlink", young), ("plain-01", "nvlink", young), ("tray-00", "gpu_hardware", young)]
    assert nvlink.settling(session, findings=found, now=now, settings=settings) == {"tray-00"}
    # Its first NVLink finding is what counts: seen long enough ago, the tray is decided now.
    assert nvlink.settling(session, findings=[*found, ("tray-00", "nvlink", old)], now=now, settings=settings) == set()
    assert nvlink.settling(session, findings=found, now=now, settings=Settings(nvlink_domain_settle_s=0)) == set()
