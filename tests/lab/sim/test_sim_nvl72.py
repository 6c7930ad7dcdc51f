"""The simulated GB200 NVL72 rack (lab/sim/nvl72.py, lab/sim/nvl72_faults.py): the signals its faults must and must
not produce, and the service driven with what its 18 trays' agents send (lab/sim/nvl72_agents.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from agents.parsers.kernel import KernelLogParser
from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from lab.sim.nvl72 import CLIQUE_ID, GPUS_PER_TRAY, LINKS_PER_GPU, SWITCH_TRAYS
from lab.sim.nvl72_agents import TrayAgents
from lab.sim.scenarios import FAULT_KINDS, SCENARIOS
from service.config import get_settings
from service.diagnosis import service as diagnosis
from service.models import Decision, Incident, Node, SharedIncident
from tests.conftest import bearer

TRAYS = 18


def _rack(scenario: str, *, start: datetime, fault_node: int | None = None) -> Cluster:
    config = SimConfig(
        nodes=TRAYS,
        scenario=scenario,
        seed=7,
        start=start,
        fault_after=10.0,
        fault_node=fault_node,
        node_prefix="nvl72-a-tray",
    )
    return Cluster(config)


def _fabrics(batches: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {b["node"]: [g["fabric"] for g in b["heartbeat"]["gpus"]] for b in batches}


def _xids(batch: dict[str, Any]) -> list[tuple[int, bool]]:
    return [(e["fields"]["xid"], e["fields"].get("fatal")) for e in batch["logs"] if e["kind"] == "xid"]


def test_an_nvl72_rack_is_18_trays_of_4_gpus_in_one_healthy_domain() -> None:
    now = datetime.now(UTC)
    cluster = _rack("healthy", start=now - timedelta(seconds=30))
    assert cluster.nvl72 is None  # only the NVLink-domain scenarios build a rack unless asked
    cluster = Cluster(SimConfig(nodes=TRAYS, scenario="healthy", seed=7, start=now, nvl72=True))
    assert cluster.gpn == GPUS_PER_TRAY and cluster.world == 72
    batches = TrayAgents(cluster).batches(cluster.advance(5.0), now=now)
    assert len(batches) == TRAYS
    fabrics = _fabrics(batches)
    domain = cluster.nvl72.cluster_uuid if cluster.nvl72 else None
    assert {(f["cluster_uuid"], f["clique_id"], f["state"], f["health"], f["degraded_bw"]) for fs in fabrics.values()
            for f in fs} == {(domain, CLIQUE_ID, "completed", "healthy", False)}  # fmt: skip
    assert all(not _xids(b) for b in batches)
    assert {m["fields"]["FAULTLINE_NVLINK_LINKS_DOWN"] for b in batches for m in b["metrics"]} == {0.0}


def test_a_switch_tray_failure_degrades_every_tray_and_logs_sxids_on_the_switch() -> None:
    now = datetime.now(UTC)
    cluster = _rack("nvswitch_tray_failure", start=now - timedelta(seconds=30))
    assert SCENARIOS["nvswitch_tray_failure"].nvl72 and FAULT_KINDS["nvswitch_tray_failure"].action == "cordon"
    agents = TrayAgents(cluster)
    before = agents.batches(cluster.advance(9.0), now=now - timedelta(seconds=21))
    assert all(f["degraded_bw"] is False for fs in _fabrics(before).values() for f in fs)
    after = agents.batches(cluster.advance(20.0), now=now)
    fabrics = _fabrics(after)
    assert len(fabrics) == TRAYS
    assert {(f["health"], f["degraded_bw"], f["state"]) for fs in fabrics.values() for f in fs} == {
        ("limited_capacity", True, "completed")
    }
    # Every GPU lost its 2 links to the switch tray, and logged a fatal NVLink5 Xid for each.
    assert {m["fields"]["FAULTLINE_NVLINK_LINKS_DOWN"] for b in after for m in b["metrics"]} == {2.0}
    assert all(_xids(b) == [(149, True)] * (2 * GPUS_PER_TRAY) for b in after)
    record = cluster.faults[0].to_json()
    assert record["kind"] == "nvswitch_tray_failure" and record["expect_action"] == "cordon"
    assert len(record["links"]) == LINKS_PER_GPU // SWITCH_TRAYS and len(record["trays"]) == TRAYS
    # The switch tray's own log: fatal SXids the agent's kernel parser reads.
    assert cluster.nvl72 is not None and cluster.nvl72.manager == "degraded"
    lines = cluster.nvl72.switch_lines()
    assert {name for name, _ in lines} == {record["switch_tray"]}
    parser = KernelLogParser()
    events = [e for _, msg in lines for e in parser.feed(msg, now=now)]
    assert [(e.kind, e.fields["sxid"], e.fields["fatal"]) for e in events] == [("sxid", 20034, True)] * 2


def test_a_trays_own_nvlink_fault_shows_on_that_tray_only() -> None:
    now = datetime.now(UTC)
    cluster = _rack("nvl72_tray_nvlink", start=now - timedelta(seconds=30), fault_node=5)
    batches = TrayAgents(cluster).batches(cluster.advance(20.0), now=now)
    bad = [b for b in batches if _xids(b)]
    assert [b["node"] for b in bad] == ["nvl72-a-tray005"]
    assert {x for x in _xids(bad[0])} == {(149, True)}
    fabrics = _fabrics(batches)
    assert sorted(f["health"] for f in fabrics["nvl72-a-tray005"]) == ["healthy"] * 3 + ["unhealthy"]
    assert all(f["health"] == "healthy" for name, fs in fabrics.items() if name != "nvl72-a-tray005" for f in fs)
    assert FAULT_KINDS["nvl72_tray_nvlink"].action == "evict"


# -- the service, driven with what the rack's agents send ---------------------------------------------------------


def _drive(
    client, session, scenario: str, *, fault_node: int | None = None, settle_passes: bool = True
) -> tuple[Cluster, datetime]:
    """Run the rack 30 s past its fault, post every tray's batches, and run the job's diagnosis passes."""
    now = datetime.now(UTC)
    cluster = _rack(scenario, start=now - timedelta(seconds=40), fault_node=fault_node)
    agents = TrayAgents(cluster)
    headers = bearer(_token(session, "agent"))
    for t, at in ((9.0, now - timedelta(seconds=30)), (40.0, now)):
        for payload in agents.batches(cluster.advance(t), now=at):
            response = client.post("/api/v1/ingest", json=payload, headers=headers)
            assert response.status_code == 200, response.text
    settings = get_settings()
    job_id = cluster.config.job_id
    assert job_id is not None
    diagnosis.diagnose_events(session, job_id=job_id, settings=settings, now=now)
    diagnosis.diagnose_job(session, job_id=job_id, settings=settings, now=now + timedelta(seconds=5))
    if settle_passes:  # past the trays' settling time (FAULTLINE_NVLINK_DOMAIN_SETTLE_S): a tray is decided alone
        later = now + timedelta(seconds=settings.nvlink_domain_settle_s + 10)
        diagnosis.diagnose_job(session, job_id=job_id, settings=settings, now=later)
    return cluster, now


def _token(session, scope: str) -> str:
    from service.tokens import service as tokens

    return tokens.create(session, scope=scope, node_name=None).token


def _decisions(session) -> list[tuple[str, str, str | None, int | None]]:
    rows = session.execute(
        select(Node.name, Decision.kind, Decision.state, Decision.shared_incident_id)
        .join(Node, Node.id == Decision.node_id)
        .order_by(Node.name, Decision.kind)
    ).all()
    return [tuple(r) for r in rows]


@pytest.mark.usefixtures("session")
def test_a_switch_tray_failure_is_one_domain_incident_that_cordons_the_domain(client, session) -> None:
    cluster, _ = _drive(client, session, "nvswitch_tray_failure")
    assert cluster.nvl72 is not None
    shared = session.scalars(select(SharedIncident)).all()
    assert [(s.component_kind, s.component, s.state) for s in shared] == [
        ("nvlink_domain", cluster.nvl72.cluster_uuid, "open")
    ]
    incident = shared[0]
    assert len(incident.members) == TRAYS
    decisions = _decisions(session)
    # The domain's decision: every tray cordoned from new work, each linked to the domain incident ...
    cordons = [d for d in decisions if d[1] == "cordon"]
    assert sorted(d[0] for d in cordons) == sorted(cluster.node_names[:TRAYS])
    assert {d[3] for d in cordons} == {incident.id}
    # ... and no tray taken out on its own: the trays' NVLink Xids are the switch tray's, not theirs.
    assert [d for d in decisions if d[1] in ("evict", "reset_gpu") and d[2] not in ("rejected",)] == []
    per_node = session.scalars(select(Incident)).all()
    # One domain incident, not 18 node incidents: no incident of the job blames a tray's NVLink.
    assert [i.id for i in per_node if i.root_cause in ("nvlink", "straggler")] == []
    print("NVL72 switch-tray failure: shared incident", incident.id, incident.summary)
    print("  evidence:", {k: incident.evidence[k] for k in ("level", "switch_side", "trays", "categories")})
    print("  decisions:", decisions)
    print("  job incidents:", [(i.id, i.root_cause, i.state, [s.get("node") for s in i.suspects]) for i in per_node])
    scheduler = bearer(_token(session, "scheduler"))
    view = client.get(f"/api/v1/nvlink-domains/{cluster.nvl72.cluster_uuid}", headers=scheduler).json()
    assert (view["state"], view["usable_nodes"], view["shared_incident_id"]) == ("failed", [], incident.id)
    print("  GET /api/v1/nvlink-domains/{uuid}:", {k: view[k] for k in ("state", "healthy", "usable_nodes", "summary")})


def test_a_trays_own_nvlink_fault_takes_out_that_tray_alone(client, session) -> None:
    cluster, now = _drive(client, session, "nvl72_tray_nvlink", fault_node=5, settle_passes=False)
    assert _decisions(session) == []  # still settling: the domain's other trays may report the same in a moment
    settings = get_settings()
    later = now + timedelta(seconds=settings.nvlink_domain_settle_s + 10)
    assert cluster.config.job_id is not None
    diagnosis.diagnose_job(session, job_id=cluster.config.job_id, settings=settings, now=later)
    assert session.scalars(select(SharedIncident)).all() == []
    decisions = _decisions(session)
    assert {d[0] for d in decisions} == {"nvl72-a-tray005"}
    assert [d[1] for d in decisions if d[0] == "nvl72-a-tray005"] == ["evict"]
    # The scheduler API: the domain degraded, every tray but the faulty one usable for a tensor-parallel group.
    assert cluster.nvl72 is not None
    scheduler = bearer(_token(session, "scheduler"))
    view = client.get(f"/api/v1/nvlink-domains/{cluster.nvl72.cluster_uuid}", headers=scheduler).json()
    assert (view["state"], view["healthy"]) == ("degraded", False)
    assert view["usable_nodes"] == [n for n in cluster.node_names[:TRAYS] if n != "nvl72-a-tray005"]
    print("NVL72 tray NVLink fault: decisions", decisions)


def test_trays_reporting_one_by_one_end_in_the_domain_incident(client, session) -> None:
    """The first tray's batch alone looks like that tray's fault: it settles for a few seconds, the others report,
    and the domain incident explains them all; no tray is ever decided alone."""
    now = datetime.now(UTC)
    cluster = _rack("nvswitch_tray_failure", start=now - timedelta(seconds=40))
    agents = TrayAgents(cluster)
    headers = bearer(_token(session, "agent"))
    settings = get_settings()
    job_id = cluster.config.job_id
    assert job_id is not None
    first, *rest = agents.batches(cluster.advance(40.0), now=now)
    for group, at in (([first], now), (rest, now + timedelta(seconds=5))):
        for payload in group:
            assert client.post("/api/v1/ingest", json=payload, headers=headers).status_code == 200
        diagnosis.diagnose_events(session, job_id=job_id, settings=settings, now=at)
    diagnosis.diagnose_job(session, job_id=job_id, settings=settings, now=now + timedelta(seconds=60))
    decisions = _decisions(session)
    assert len(session.scalars(select(SharedIncident)).all()) == 1
    assert sorted(d[0] for d in decisions if d[1] == "cordon") == sorted(cluster.node_names[:TRAYS])
    # The first tray, alone for a pass, was never decided on its own: no eviction was ever made, even superseded.
    assert [d for d in decisions if d[1] != "cordon"] == []
