"""The job pages: the list, ranks on nodes, the parallel-group grid, and the effective training time ratio."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from service.jobs.costs import covered_seconds, ettr, incident_interval, job_window, merge_intervals
from service.models import Job, Node, Rank
from service.ui.views.jobs import counts_against_ettr, ranges
from tests import rows

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _t(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


# --- ETTR, pure ---------------------------------------------------------------------------------------------


def test_overlapping_incidents_lose_their_time_once() -> None:
    lost = [(_t(10), _t(30)), (_t(20), _t(40)), (_t(50), _t(55))]
    assert merge_intervals(lost) == [(_t(10), _t(40)), (_t(50), _t(55))]
    e = ettr(lost, start=_t(0), end=_t(100))
    assert e.wall_s == 6000 and e.lost_s == 35 * 60
    assert e.ratio == pytest.approx(65 / 100)


def test_nested_touching_and_empty_intervals() -> None:
    assert merge_intervals([(_t(0), _t(10)), (_t(10), _t(20)), (_t(2), _t(5)), (_t(30), _t(30))]) == [(_t(0), _t(20))]
    assert covered_seconds([], start=_t(0), end=_t(10)) == 0


def test_an_open_incident_costs_until_now() -> None:
    now = _t(60)
    interval = incident_interval(_t(45), None, now=now)
    assert interval == (_t(45), now)
    e = ettr([interval, incident_interval(_t(5), _t(10), now=now)], start=_t(0), end=now)
    assert e.lost_s == 20 * 60 and e.ratio == pytest.approx(40 / 60)


def test_the_last_hour_counts_only_what_falls_inside_it() -> None:
    now = _t(180)
    lost = [(_t(30), _t(90)), (_t(100), _t(130)), (_t(170), now)]
    hour = ettr(lost, start=now - timedelta(hours=1), end=now)
    # From 120 on: 10 min of the second incident, 10 of the open one.
    assert hour.lost_s == 20 * 60 and hour.ratio == pytest.approx(40 / 60)
    total = ettr(lost, start=_t(0), end=now)
    assert total.lost_s == 100 * 60


def test_incidents_before_the_job_or_after_the_window_do_not_count_and_an_empty_window_has_no_ratio() -> None:
    assert ettr([(_t(-30), _t(10)), (_t(70), _t(90))], start=_t(0), end=_t(60)).lost_s == 600
    empty = ettr([(_t(0), _t(10))], start=_t(5), end=_t(5))
    assert empty.ratio is None and empty.lost_s == 0


def test_merged_incidents_do_not_count_and_an_ended_job_s_window_ends_at_its_last_report() -> None:
    assert not counts_against_ettr("merged: its findings belong to another incident")
    assert counts_against_ettr("mitigated: evict done") and counts_against_ettr(None)
    assert job_window(_t(0), _t(30), running=False, now=_t(90)) == (_t(0), _t(30))
    assert job_window(_t(0), None, running=False, now=_t(90)) == (_t(0), _t(90))
    # A running job whose agents went quiet keeps losing time until now.
    assert job_window(_t(0), _t(30), running=True, now=_t(90)) == (_t(0), _t(90))


def test_ranges_reads_like_a_person_writes_them() -> None:
    assert ranges([3, 0, 1, 2, 8, 10, 11, None]) == "0-3, 8, 10-11"
    assert ranges([]) == ""


# --- pages --------------------------------------------------------------------------------------------------


def _job(session, external_id: str, *, world: int, tp=None, pp=None, dp=None, per_node: int = 8, **values) -> Job:  # type: ignore[no-untyped-def]
    job = Job(
        external_id=external_id,
        source="registered",
        world_size=world,
        tp=tp,
        pp=pp,
        dp=dp,
        rank_order="tp-dp-pp" if tp else None,
        **values,
    )
    session.add(job)
    session.flush()
    nodes = [rows.node(session, f"{external_id}-n{i:03d}") for i in range(max(1, world // per_node))]
    session.add_all(
        [
            Rank(job_id=job.id, rank=r, node_id=nodes[r // per_node].id, local_rank=local, gpu_index=local)
            for r, local in ((r, r % per_node) for r in range(world))
        ]
    )
    session.flush()
    return job


def _section(html: str, section: str) -> str:
    return html.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]


def _rows(html: str) -> list[str]:
    return re.findall(r"<tr[^>]*>(.*?)</tr>", html, flags=re.S)[1:]


def _cells(row: str) -> list[str]:
    """A table row's cells as text."""
    return [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_the_list_shows_size_parallelism_nodes_and_open_incidents(ui, session) -> None:
    big = _job(session, "llm-pretrain-42", world=16, tp=4, pp=2, dp=2)
    rows.incident(session, job=big, state="open")
    rows.incident(session, job=big, root_cause="hang", state="mitigating")
    rows.incident(session, job=big, root_cause="network", state="resolved")
    _job(session, "finetune-7", world=8, state="finished")
    page = ui.get("/jobs")
    assert page.status_code == 200
    listed = {re.search(r'href="/jobs/([^"]+)"', r).group(1): r for r in _rows(page.text)}
    assert list(listed) == ["finetune-7", "llm-pretrain-42"]  # newest first
    row = listed["llm-pretrain-42"]
    assert "TP 4 \N{MULTIPLICATION SIGN} PP 2 \N{MULTIPLICATION SIGN} DP 2" in row and ">16</td>" in row
    cells = re.findall(r'<td class="num">(.*?)</td>', row, flags=re.S)
    assert cells[1] == "2"  # nodes
    assert ">2</b>" in cells[2] and "job=llm-pretrain-42" in cells[2]  # the two unresolved incidents, linked
    assert "not registered" in listed["finetune-7"] and "jstate-finished" in listed["finetune-7"]
    assert list(re.findall(r'href="/jobs/([^"]+)"', ui.get("/jobs?state=finished").text)) == ["finetune-7"]
    assert list(re.findall(r'href="/jobs/([^"]+)"', ui.get("/jobs?name=PRETRAIN").text)) == ["llm-pretrain-42"]
    assert ui.get("/jobs?state=lost").status_code == 422


def test_the_list_pages_newest_first(ui, session) -> None:
    for i in range(5):
        rows.job(session, f"pg-job-{i}")
    first = ui.get("/jobs?limit=2&name=pg-job")
    assert re.findall(r'href="/jobs/(pg-job-\d)"', first.text) == ["pg-job-4", "pg-job-3"]
    link = re.search(r'href="\?([^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")
    second = ui.get(f"/jobs?{link}&limit=2")
    assert re.findall(r'href="/jobs/(pg-job-\d)"', second.text) == ["pg-job-2", "pg-job-1"]


def test_the_list_sends_the_same_queries_for_3_or_30_jobs(ui, session, count_queries) -> None:
    counts = []
    for n in (3, 30):
        for i in range(n - (3 if counts else 0)):
            job = _job(session, f"cq-{n}-{i}", world=8, per_node=4)
            rows.incident(session, job=job, state="open")
        with count_queries() as q:
            assert ui.get("/jobs?limit=100").status_code == 200
        counts.append(q.count)
    assert counts[0] == counts[1]


def test_the_job_page_maps_ranks_to_nodes_and_draws_the_parallel_groups(ui, session) -> None:
    # tp=2, pp=2, dp=2 in Megatron order tp-dp-pp, two ranks a node: each node holds one TP group.
    _job(session, "llm-pretrain-42", world=8, tp=2, pp=2, dp=2, per_node=2)
    sick = session.scalar(select(Node).where(Node.name == "llm-pretrain-42-n003"))
    sick.state = "evicted"
    session.flush()
    page = ui.get("/jobs/llm-pretrain-42")
    assert page.status_code == 200
    placement = _rows(_section(page.text, "job-placement"))
    assert len(placement) == 4
    # node | state | ranks | local ranks | GPUs | TP groups | PP stages | DP replicas
    first = _cells(placement[0])
    assert first[0] == "llm-pretrain-42-n000" and first[2:] == ["0-1 (2)", "0-1", "0-1", "0", "0", "0"]
    third = _cells(placement[2])
    assert third[2] == "4-5 (2)" and third[5:] == ["1", "1", "0"]  # ranks 4-5: PP stage 1 of DP replica 0
    assert "state-evicted" in placement[3] and 'class="highlight"' in _section(page.text, "job-placement")
    grid = _section(page.text, "job-grid")
    cells = [
        re.findall(r'<td class="(cell-[a-z_]+)"[^>]*>\s*<a class="mono" href="/nodes/([^"]+)"', row, re.S)
        for row in _rows(grid)
    ]
    assert cells == [
        [("cell-healthy", "llm-pretrain-42-n000"), ("cell-healthy", "llm-pretrain-42-n002")],
        [("cell-healthy", "llm-pretrain-42-n001"), ("cell-evicted", "llm-pretrain-42-n003")],
    ]


def test_replicas_on_the_same_nodes_share_a_grid_row_and_unplaced_ranks_show(ui, session) -> None:
    # Pure data parallelism, 8 ranks a node: one row a node, not one a replica. Ranks 16-23 never reported.
    job = _job(session, "dp-only", world=16, tp=1, pp=1, dp=24)
    job.world_size = 24
    session.flush()
    page = ui.get("/jobs/dp-only")
    grid = _section(page.text, "job-grid")
    labels = [re.search(r"<th[^>]*>(.*?)</th>", row).group(1) for row in _rows(grid)]
    assert labels == ["0-7", "8-15", "16-23"]
    assert 'title="TP groups 0-7"' in grid
    assert "cell-empty" in _rows(grid)[2] and "not placed" in _rows(grid)[2]
    assert "8 ranks not placed on a node yet" in _section(page.text, "job-facts")


def test_a_job_without_parallelism_still_shows_its_ranks(ui, session) -> None:
    _job(session, "agent-seen-1", world=16)
    page = ui.get("/jobs/agent-seen-1")
    assert page.status_code == 200
    assert len(_rows(_section(page.text, "job-placement"))) == 2
    assert "TP groups" not in page.text
    assert "No parallelism registered for this job" in page.text


def test_the_job_page_shows_ettr_and_the_incidents_that_cost_it(ui, session) -> None:
    now = datetime.now(UTC)
    job = _job(session, "ettr-job", world=8, tp=8, pp=1, dp=1, created_at=now - timedelta(hours=2))
    old = rows.incident(
        session,
        job=job,
        root_cause="network",
        state="resolved",
        opened_at=now - timedelta(minutes=90),
        resolved_at=now - timedelta(minutes=60),
        resolution="mitigated: evict done",
    )
    current = rows.incident(session, job=job, root_cause="hang", state="open", opened_at=now - timedelta(minutes=20))
    merged = rows.incident(
        session,
        job=job,
        root_cause="straggler",
        state="resolved",
        opened_at=now - timedelta(minutes=15),
        resolved_at=now - timedelta(minutes=5),
        resolution="merged: its findings belong to another incident",
    )
    page = ui.get("/jobs/ettr-job")
    ettr_card = _section(page.text, "job-ettr")
    # 50 of 120 minutes lost since the start; 20 of the last 60.
    assert re.findall(r'<b class="ettr [^"]+">([\d.]+%)</b>', ettr_card) == ["58.3%", "66.7%"]
    assert "The share of wall time no incident of the job was open" in ettr_card
    assert "1 merged incident not counted" in ettr_card
    section = _section(page.text, "job-incidents")
    costly = re.findall(r'<tr data-incident="(\d+)">(.*?)</tr>', section, flags=re.S)
    assert [i for i, _ in costly] == [str(old.id), str(current.id)]  # most costly first; the merged one is not there
    assert f'data-incident="{merged.id}"' not in section and f"/incidents/{merged.id}" not in section
    assert "30.0 min" in costly[0][1] and "20.0 min" in costly[1][1] and "ongoing" in costly[1][1]
    # Estimated from open time (no step lines): the total is the union of the intervals, 50 min of 120.
    assert "estimated from the incidents' open time" in section
    assert 'id="cost-total">50.0 min<' in section and 'id="cost-charged">50.0 min<' in section
    assert "ETTR 58.3%" in section and 'id="cost-free"' not in section


def test_the_job_page_sends_the_same_queries_for_16_or_256_ranks(ui, session, count_queries) -> None:
    counts = []
    for world, incidents in ((16, 1), (256, 12)):
        job = _job(session, f"scale-{world}", world=world, tp=8, pp=2, dp=world // 16)
        for i in range(incidents):
            rows.incident(session, job=job, root_cause=f"cause-{i}", state="open" if i % 2 else "resolved")
        with count_queries() as q:
            page = ui.get(f"/jobs/scale-{world}")
        assert page.status_code == 200
        counts.append(q.count)
    assert len(_rows(_section(page.text, "job-placement"))) == 32
    assert counts[0] == counts[1]


def test_an_unknown_job_is_a_404_page(ui) -> None:
    page = ui.get("/jobs/no-such-job")
    assert page.status_code == 404
    assert "no job" in page.text
