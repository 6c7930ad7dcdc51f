"""The fleet page (repair times per stage, root cause and node) and the job page's warm-standby line."""

from __future__ import annotations

import re

from tests import rows
from tests.service.fleet import history


def _section(html: str, section: str) -> str:
    return html.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]


def _cells(html: str) -> list[list[str]]:
    return [
        [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, flags=re.S)[1:]
    ]


def test_the_fleet_page_shows_p50_and_p90_per_stage_root_cause_and_slowest_node(ui, session) -> None:
    history.build(session)
    page = ui.get("/fleet?window=7d")
    assert page.status_code == 200
    assert 'href="/fleet" class="active"' in page.text
    (fleet,) = _cells(_section(page.text, "fleet-stages"))
    # detect 12 s / 34 s, decide 8 s / 50 s, act 30 s / 54 s, return 20.0 min / 28.0 min.
    assert fleet == ["all", "3", "12 s / 34 s", "8 s / 50 s", "30 s / 54 s", "20.0 min / 28.0 min"]
    causes = {r[0]: r for r in _cells(_section(page.text, "fleet-root-causes"))}
    assert causes["network"] == ["network", "1", "40 s / 40 s", "60 s / 60 s", "30 s / 30 s", "10.0 min / 10.0 min"]
    nodes = _cells(_section(page.text, "fleet-nodes"))
    assert [r[0] for r in nodes] == ["n1", "n2", "n3"]
    assert nodes[2][-1] == "—"


def test_the_fleet_page_says_when_there_is_nothing_to_show_and_refuses_unknown_windows(ui, session) -> None:
    page = ui.get("/fleet")
    assert page.status_code == 200
    assert "No incident was opened in the last 7d" in _section(page.text, "fleet-empty")
    assert ui.get("/fleet?window=5y").status_code == 422


def test_the_job_page_shows_warm_standbys_or_why_not(ui, session) -> None:
    history.build(session)
    page = ui.get("/jobs/llm-repair")
    line = " ".join(re.sub(r"<[^>]+>", " ", page.text.split('id="job-spares">', 1)[1].split("</dd>", 1)[0]).split())
    assert line.startswith("Warm standbys for 24 h at p99: 2 for 3 nodes")
    assert "fleet failure rate 4.2 per 1000 node-hours, from 3 failures in 30 d" in line

    empty = rows.job(session)
    page = ui.get(f"/jobs/{empty.external_id}")
    assert "no rank placed on a node yet" in page.text.split('id="job-spares">', 1)[1].split("</dd>", 1)[0]


def test_the_fleet_page_sends_the_same_queries_for_3_or_23_incidents(ui, session, count_queries) -> None:
    h = history.build(session)
    with count_queries() as q:
        assert ui.get("/fleet").status_code == 200
    few = q.count
    for _ in range(20):
        incident = rows.incident(session, job=h.job, suspects=["n2"], state="resolved")
        rows.decision(session, incident=incident, node=h.nodes["n2"], state="done")
    with count_queries() as q:
        page = ui.get("/fleet")
    assert q.count == few
    assert "23 incidents in the last 7d" in page.text
