"""Unknown lines: error-looking lines no rule knows, counted per form at ingest and shown by the API, /metrics and
the retention pass (issue 41 point 5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from service.maintenance import service as maintenance
from service.unknown_lines.record import hour_of
from tests.conftest import bearer, count
from tests.factories import batch

URL = "/api/v1/unknown-lines"


def _now() -> datetime:
    # Read at each use, not at import: a long run collects this module well before it runs it.
    return datetime.now(UTC)


def training_line(rank: int, shard: int, host: str, retries: int) -> str:
    return f"[rank{rank}]: FooComm error: shard {shard} of 64 stalled on {host} after {retries} retries"


def kernel_line(bus: int, addr: int, pid: int) -> str:
    return f"qux_core 0000:{bus:02x}:00.0: firmware page fault at 0x{addr:x}, pid {pid}"


def unknown(line: str, ts: datetime, *, source: str = "training", **extra: Any) -> dict[str, Any]:
    return {"ts": ts.isoformat(), "source": source, "kind": "unmatched_error", "severity": "warning", "line": line,
            **extra}  # fmt: skip


def post(client: Any, agent: dict[str, str], node: str, logs: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    payload = batch(node, gpus=1, **kw)
    payload["logs"] = payload["logs"] + logs  # the factory's Xid line rides along: a known line, never counted
    response = client.post("/api/v1/ingest", json=payload, headers=agent)
    assert response.status_code == 200, response.text
    return payload


@pytest.fixture
def agent(make_token) -> dict[str, str]:
    return bearer(make_token("agent"))


@pytest.fixture
def reader(make_token) -> dict[str, str]:
    return bearer(make_token("scheduler"))


@pytest.fixture
def seeded(client, agent) -> dict[str, Any]:
    """Form A (training) 3 lines on node-a in job-1 and 2 on node-b in job-2; form B (kmsg) 2 lines on node-a."""
    t = [_now() - timedelta(minutes=30) + timedelta(seconds=i) for i in range(10)]
    a_lines = [
        unknown(training_line(3, 17, "node-a", 5), t[0]),
        unknown(training_line(5, 2, "node-a", 11), t[1]),
        unknown(training_line(7, 40, "node-a", 2), t[4]),
    ]
    b_lines = [unknown(kernel_line(0x3B, 0x7F3A1000, 4411), t[2], source="kmsg"),
               unknown(kernel_line(0xCB, 0x1234, 98), t[5], source="kmsg")]  # fmt: skip
    first = post(client, agent, "node-a", a_lines + b_lines, job_id="job-1")
    post(client, agent, "node-b", [unknown(training_line(1, 9, "node-b", 3), t[3]),
                                   unknown(training_line(2, 61, "node-b", 7), t[8])], job_id="job-2")  # fmt: skip
    return {"t": t, "first": first}


def _items(client, reader, query: str = "") -> list[dict[str, Any]]:
    response = client.get(f"{URL}{query}", headers=reader)
    assert response.status_code == 200, response.text
    return response.json()["items"]


def test_lines_are_counted_per_form_with_nodes_jobs_sources_and_times(client, reader, seeded, session) -> None:
    t = seeded["t"]
    a, b = _items(client, reader)
    assert a["form"] == "[rank<rank>]: FooComm error: shard <num> of <num> stalled on <host> after <num> retries"
    assert (a["count"], a["nodes"], a["sources"], a["top_nodes"]) == (5, 2, ["training"], ["node-a", "node-b"])
    assert sorted(a["jobs"]) == ["job-1", "job-2"] and a["job_count"] == 2
    assert datetime.fromisoformat(a["first_seen_at"]) == t[0]
    assert datetime.fromisoformat(a["last_seen_at"]) == t[8]
    assert a["example"] == training_line(3, 17, "node-a", 5)
    assert b["form"] == "qux_core <pci>: firmware page fault at <hex>, pid <pid>"
    assert (b["count"], b["nodes"], b["sources"], b["top_nodes"], b["jobs"]) == (2, 1, ["kmsg"], ["node-a"], ["job-1"])
    assert datetime.fromisoformat(b["first_seen_at"]) == t[2]
    assert datetime.fromisoformat(b["last_seen_at"]) == t[5]
    # The stored events are untouched: the Xid lines and the unknown ones are all there.
    assert count(session, "log_events") == 2 + 7
    # One row per form, source, node, job and hour (the test's lines may straddle an hour).
    assert 3 <= count(session, "unknown_line_counts") <= 6
    assert count(session, "unknown_line_forms") == 2


def test_a_replayed_batch_is_not_counted_twice(client, agent, reader, seeded) -> None:
    again = client.post("/api/v1/ingest", json=seeded["first"], headers=agent)
    assert again.json()["status"] == "duplicate"
    assert [i["count"] for i in _items(client, reader)] == [5, 2]


def test_more_lines_in_later_batches_add_to_the_form(client, agent, reader, seeded) -> None:
    later = _now() - timedelta(minutes=1)
    post(client, agent, "node-c", [unknown(training_line(0, 1, "node-c", 1), later)], job_id=None)
    a = _items(client, reader)[0]
    assert (a["count"], a["nodes"], a["job_count"]) == (6, 3, 2)
    assert datetime.fromisoformat(a["last_seen_at"]) == later


def test_filters_by_source_node_job_and_since(client, agent, reader, seeded) -> None:
    old = _now() - timedelta(hours=3)
    post(client, agent, "node-a", [unknown("ZapLib: ring 4 stuck for 300 ms", old)], job_id="job-1")

    def forms(query: str) -> dict[str, tuple[int, int]]:
        return {i["form"].split(":")[0]: (i["count"], i["nodes"]) for i in _items(client, reader, query)}

    assert forms("") == {"[rank<rank>]": (5, 2), "qux_core <pci>": (2, 1), "ZapLib": (1, 1)}
    assert forms("?source=kmsg") == {"qux_core <pci>": (2, 1)}
    assert forms("?node=NODE-B") == {"[rank<rank>]": (2, 1)}  # a part of the name, any case
    assert forms("?job=job-2") == {"[rank<rank>]": (2, 1)}
    assert forms("?node=node-a&source=training") == {"[rank<rank>]": (3, 1), "ZapLib": (1, 1)}
    assert forms("?since=1h") == {"[rank<rank>]": (5, 2), "qux_core <pci>": (2, 1)}
    assert "ZapLib" in forms("?since=" + (_now() - timedelta(hours=4)).isoformat().replace("+00:00", "Z"))
    assert forms("?node=nobody") == {}


def test_pages_follow_the_count_and_cover_every_form_once(client, agent, reader, seeded) -> None:
    post(client, agent, "node-a", [unknown("ZapLib: ring 4 stuck", _now() - timedelta(minutes=2))])
    seen: list[tuple[str, int]] = []
    url: str | None = f"{URL}?limit=1"
    while url:
        body = client.get(url, headers=reader).json()
        assert len(body["items"]) <= 1
        seen += [(i["form_id"], i["count"]) for i in body["items"]]
        url = f"{URL}?limit=1&cursor={body['next_cursor']}" if body["next_cursor"] else None
    assert [c for _, c in seen] == [5, 2, 1]
    assert len({f for f, _ in seen}) == 3


@pytest.mark.parametrize(
    "query",
    [
        "since=yesterday",
        "since=0h",
        "since=400d",
        "since=2999-01-01T00:00:00Z",  # ahead of now
        "since=2026-11-22T09:00:00",  # no time zone
        "source=KMSG!",
        "cursor=nonsense",
        "cursor=" + "A" * 65,
        "limit=0",
        "limit=501",
    ],
)
def test_bad_filters_are_422_naming_the_parameter(client, reader, query) -> None:
    response = client.get(f"{URL}?{query}", headers=reader)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid"
    assert query.split("=")[0] in body["message"] + str(body.get("details"))


def test_people_and_schedulers_read_it_agents_do_not(client, make_token) -> None:
    assert client.get(URL).status_code == 401
    assert client.get(URL, headers=bearer(make_token("agent", name="a1"))).status_code == 403
    for scope in ("scheduler", "operator", "admin"):
        assert client.get(URL, headers=bearer(make_token(scope, name=f"r-{scope}"))).status_code == 200


def _metric(client, name: str, labels: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name}{{{labels}}}"):
            return float(line.split()[-1])
    return 0.0


def test_metrics_count_unknown_lines_by_source_and_forms_of_the_day(client, agent, make_token) -> None:
    before = {s: _metric(client, "faultline_unknown_log_lines_total", f'source="{s}"') for s in ("training", "kmsg")}
    ts = _now() - timedelta(minutes=5)
    payload = post(
        client,
        agent,
        "node-m",
        [unknown(training_line(i, i, "node-m", i), ts) for i in range(4)]
        + [unknown(kernel_line(1, 2, 3), ts, source="kmsg")],
    )
    assert _metric(client, "faultline_unknown_log_lines_total", 'source="training"') == before["training"] + 4
    assert _metric(client, "faultline_unknown_log_lines_total", 'source="kmsg"') == before["kmsg"] + 1
    # A replay stores nothing and counts nothing.
    assert client.post("/api/v1/ingest", json=payload, headers=agent).json()["status"] == "duplicate"
    assert _metric(client, "faultline_unknown_log_lines_total", 'source="training"') == before["training"] + 4
    # The gauge is read from the database (one form per source here), cached 15 s per API process: the reads
    # above cached it before the lines came.
    client.app.state.unknown_gauges.clear()
    assert _metric(client, "faultline_unknown_log_forms", 'source="training"') == 1
    assert _metric(client, "faultline_unknown_log_forms", 'source="kmsg"') == 1


def test_retention_forgets_old_hours_and_the_forms_nobody_counts_any_more(session) -> None:
    import service.unknown_lines.retention  # noqa: F401  (registers the pruner, as the worker does at start)

    now = _now()
    old = now - timedelta(days=40)
    session.execute(
        text(
            "INSERT INTO unknown_line_forms (form_id, form, example, source, created_at) VALUES "
            "('00000000000000aa', 'old <num>', 'old 1', 'kmsg', :old), "
            "('00000000000000bb', 'kept <num>', 'kept 1', 'kmsg', :old)"
        ),
        {"old": old},
    )
    session.execute(
        text(
            "INSERT INTO unknown_line_counts (hour, form_id, source, node_id, job_id, lines, first_seen_at, "
            "last_seen_at) VALUES (:old_hour, '00000000000000aa', 'kmsg', 1, NULL, 9, :old, :old), "
            "(:old_hour, '00000000000000bb', 'kmsg', 1, NULL, 4, :old, :old), "
            "(:hour, '00000000000000bb', 'kmsg', 1, 7, 2, :now, :now)"
        ),
        {"old": old, "old_hour": hour_of(old), "now": now, "hour": hour_of(now)},
    )
    pruned = maintenance.prune_registered(session, now=now)
    assert pruned["unknown_line_counts"] == 2
    assert session.execute(text("SELECT form_id, lines FROM unknown_line_counts")).all() == [("00000000000000bb", 2)]
    assert session.execute(text("SELECT form_id FROM unknown_line_forms")).scalars().all() == ["00000000000000bb"]


def test_the_drivers_lines_of_no_known_form_are_counted_and_its_known_ones_are_not(client, agent, reader) -> None:
    # As the agent's kernel parser ships them: an NVRM warning no form knows (a new driver's message, its shape
    # made up here) is unknown; a GSP RPC timeout it knows (tests/fixtures/logs/gsp_heartbeat_rpc_timeout_gh100_
    # opengpu_1230.txt) and a plain informational NVRM line are not.
    from agents.parsers import parse_text
    from agents.parsers.kernel import KernelLogParser

    text = (
        "[ 101.5] NVRM: GPU0 kfooBarUpdate: failed to refresh the widget cache (0x1a) on GPU 0000:3b:00.0\n"
        "[ 102.5] NVRM: GPU0 kfooBarUpdate: failed to refresh the widget cache (0x2c) on GPU 0000:5e:00.0\n"
        "[ 103.5] NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout "
        "**********************************\n"
        "[ 104.5] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.86.15\n"
    )
    now = _now()
    events = parse_text(KernelLogParser(boot_time=now - timedelta(hours=1)), text, now=now)
    logs = [e.to_wire() for e in events]
    assert {e.kind for e in events} == {"nvrm"}
    post(client, agent, "node-k", logs, job_id=None)
    items = [i for i in _items(client, reader, "?source=kmsg") if "kfooBarUpdate" in i["example"]]
    assert len(items) == 1 and items[0]["count"] == 2, items
    known = [i for i in _items(client, reader, "?source=kmsg") if "GSP" in i["example"] or "loading" in i["example"]]
    assert known == []
