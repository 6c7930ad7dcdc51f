"""The Unknown lines page: one row per form with its count, nodes, first and last seen, example and source; its
filters, its refusals, its link in the navigation and its count on the overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from ml.line_forms import form_of
from service.unknown_lines.record import hour_of
from tests import rows


def _now() -> datetime:
    # Read at each use, not at import: a long run collects this module well before it runs it.
    return datetime.now(UTC)


def _count(session: Session, line: str, *, node: str, source: str = "training", lines: int = 1, job: str | None = None,
           ago: timedelta = timedelta(minutes=10)) -> None:  # fmt: skip
    """Rows as ingest writes them (tests/service/unknown_lines/ drives ingest itself)."""
    form = form_of(line, host=node)
    node_id = session.execute(text("SELECT id FROM nodes WHERE name = :n"), {"n": node}).scalar()
    if node_id is None:
        node_id = rows.node(session, node).id
    job_id = None
    if job:
        job_id = session.execute(text("SELECT id FROM jobs WHERE external_id = :j"), {"j": job}).scalar()
        job_id = job_id or rows.job(session, job).id
    at = _now() - ago
    session.execute(
        text(
            "INSERT INTO unknown_line_forms (form_id, form, example, source) VALUES (:f, :form, :line, :s) "
            "ON CONFLICT DO NOTHING"
        ),
        {"f": form.form_id, "form": form.form, "line": line, "s": source},
    )
    session.execute(
        text(
            "INSERT INTO unknown_line_counts (hour, form_id, source, node_id, job_id, lines, first_seen_at, "
            "last_seen_at) VALUES (:h, :f, :s, :n, :j, :c, :t, :t)"
        ),
        {"h": hour_of(at), "f": form.form_id, "s": source, "n": node_id, "j": job_id, "c": lines, "t": at},
    )


def _seed(session: Session) -> None:
    _count(session, "[rank3]: FooComm error: shard 17 stalled on gpu-node-001", node="gpu-node-001", lines=7,
           job="llm-pretrain-42")  # fmt: skip
    _count(session, "[rank9]: FooComm error: shard 2 stalled on gpu-node-002", node="gpu-node-002", lines=4,
           job="llm-pretrain-42")  # fmt: skip
    _count(session, "qux_core 0000:3b:00.0: firmware page fault at 0x7f3a", node="gpu-node-002", source="kmsg",
           lines=2)  # fmt: skip


def test_the_page_lists_forms_with_count_nodes_times_example_and_source(ui, session) -> None:
    _seed(session)
    page = ui.get("/unknown-lines")
    assert page.status_code == 200
    html = page.text
    # The busiest form first, masked, with its example as logged.
    first, second = html.index("FooComm error: shard &lt;num&gt; stalled on &lt;host&gt;"), html.index("qux_core")
    assert first < second
    assert "[rank3]: FooComm error: shard 17 stalled on gpu-node-001" in html
    assert '<td class="num"><b>11</b></td>' in html and '<td class="num"><b>2</b></td>' in html
    assert 'href="/nodes/gpu-node-001"' in html and 'href="/nodes/gpu-node-002"' in html
    assert 'href="/jobs/llm-pretrain-42"' in html
    assert '<span class="pill">kmsg</span>' in html and '<span class="pill">training</span>' in html
    assert html.count("10 min ago") >= 4  # first and last seen of both forms
    # In the navigation, marked as the page being shown.
    assert '<a href="/unknown-lines" class="active" aria-current="page">Unknown lines</a>' in html


def test_the_page_filters_and_refuses_what_it_cannot_read(ui, session) -> None:
    _seed(session)
    _count(session, "ZapLib: ring 4 stuck", node="gpu-node-003", ago=timedelta(hours=3))
    assert "qux_core" not in ui.get("/unknown-lines?source=training").text
    kmsg = ui.get("/unknown-lines?source=kmsg").text
    assert "qux_core" in kmsg and "FooComm" not in kmsg
    by_node = ui.get("/unknown-lines?node=node-001").text
    assert '<td class="num"><b>7</b></td>' in by_node and "qux_core" not in by_node
    assert "ZapLib" in ui.get("/unknown-lines").text
    recent = ui.get("/unknown-lines?since=1h").text
    assert "ZapLib" not in recent and "FooComm" in recent
    assert "<option selected>1h</option>" in recent
    assert "No unknown lines since" in ui.get("/unknown-lines?job=no-such-job").text
    for query in ("since=soon", "source=Bad Source", "cursor=nonsense"):
        page = ui.get(f"/unknown-lines?{query}")
        assert page.status_code == 422, query
        assert "422" in page.text


def test_the_page_follows_its_next_link(ui, session) -> None:
    _seed(session)
    first = ui.get("/unknown-lines?limit=1").text
    assert "FooComm" in first and "qux_core" not in first
    link = first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    second = ui.get(f"/unknown-lines{link}").text
    assert "qux_core" in second and "FooComm" not in second


def test_the_page_reads_a_fixed_number_of_queries(ui, session, count_queries) -> None:
    _seed(session)
    with count_queries() as few:
        assert ui.get("/unknown-lines").status_code == 200
    for i in range(20):
        _count(session, f"Lib{chr(65 + i)}: broke {i}", node=f"gpu-node-{i % 7:03d}", lines=i + 1, job=f"job-{i % 3}")
    with count_queries() as many:
        page = ui.get("/unknown-lines")
    assert page.text.count("<tr data-form=") == 2 + 20
    assert many.count == few.count, (few.statements, many.statements)


def test_the_overview_counts_the_forms_of_the_day(ui, session) -> None:
    html = ui.get("/").text
    assert 'id="unknown-lines-count"' in html and "<b>0</b>forms, 0 lines in 24 h" in html
    _seed(session)
    _count(session, "ZapLib: ring 4 stuck", node="gpu-node-003", ago=timedelta(hours=30))  # older than a day
    html = ui.get("/").text
    assert "<b>2</b>forms, 13 lines in 24 h" in html
