"""The overview: open incidents by severity, decisions waiting on someone, every node as a tile."""

from __future__ import annotations

from datetime import UTC, datetime

from lab.bench import uidata
from service.incidents import service as incidents
from tests import rows


def test_the_overview_shows_what_is_open_and_waiting_and_every_node(ui, session) -> None:
    _job, _node, incident, decision = rows.eviction(session, node_name="gpu-node-017")
    decision.state = "awaiting_approval"
    incident.severity = "critical"
    rows.node(session, "gpu-node-018")
    session.flush()
    page = ui.get("/")
    assert page.status_code == 200
    html = page.text
    assert f'href="/incidents/{incident.id}"' in html
    assert f'id="decision-{decision.id}"' in html and "Approve" in html
    assert 'data-node="gpu-node-017"' in html and 'data-node="gpu-node-018"' in html
    # The accused node wears the strongest ring (an open incident names it at 95%).
    tile = html.split('data-node="gpu-node-017"')[0].rsplit("<a ", 1)[1]
    assert "score-3" in tile and "state-healthy" in tile
    assert "score-" not in html.split('data-node="gpu-node-018"')[0].rsplit("<a ", 1)[1]


def test_anomaly_scores_take_the_strongest_accusation(session) -> None:
    job = rows.job(session)
    rows.node(session, "n-a")
    rows.node(session, "n-b")
    rows.incident(session, job=job, suspects=["n-a"])
    rows.incident(session, job=job, suspects=["n-b"], root_cause="network", state="resolved")
    scores = incidents.anomaly_scores(session, now=datetime.now(UTC), window_s=300)
    assert scores == {"n-a": 0.95}


def test_the_overview_reads_a_fixed_number_of_queries_however_big_the_cluster(ui, session, count_queries) -> None:
    uidata.seed(session, nodes=16, nodes_per_job=8, incidents=10, open_incidents=4, prefix="small")
    with count_queries() as small:
        assert ui.get("/").status_code == 200
    uidata.seed(session, nodes=256, nodes_per_job=64, incidents=200, open_incidents=20, prefix="big")
    with count_queries() as big:
        page = ui.get("/")
    assert page.text.count('class="tile ') == 256 + 16
    assert big.count == small.count, (small.statements, big.statements)
