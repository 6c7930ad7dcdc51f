"""The node pages: the filtered list, one node's state, GPUs, logs, incidents and history, and the operator forms."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, text

from service.models import Decision, Directive, Finding, Gpu, LogEvent, Node, NodeEvent, Rank
from service.models.signals import metric_samples, node_samples
from tests import rows


def _gpus(session, node: Node, n: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        pci = f"0000:{0x18 + i:02x}:00.0"
        session.add(Gpu(node_id=node.id, index=i, model="NVIDIA H100 80GB HBM3", pci_bus_id=pci))
    session.flush()


def _samples(session, node: Node, *, gpus: int, at: datetime, **values: float) -> None:  # type: ignore[no-untyped-def]
    session.execute(
        metric_samples.insert().values(
            [
                {"ts": at, "node_id": node.id, "gpu": g, "gpu_util": 97.0, "power_usage": 612.5, "power_limit": 700.0}
                | values
                for g in range(gpus)
            ]
        )
    )


def _log(session, node: Node, *, kind: str, line: str, at: datetime, **values) -> LogEvent:  # type: ignore[no-untyped-def]
    values.setdefault("source", "kmsg")
    event = LogEvent(batch_id=uuid.uuid4(), node_id=node.id, ts=at, kind=kind, line=line, **values)
    session.add(event)
    session.flush()
    return event


def _finding(session, *, incident, node: Node) -> Finding:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    finding = Finding(
        dedup_key=uuid.uuid4().hex,
        job_id=incident.job_id,
        incident_id=incident.id,
        node_id=node.id,
        detector="counters",
        category="pcie",
        subject_kind="gpu",
        subject=f"{node.name}/1",
        confidence=0.4,
        summary="PCIe replays",
        evidence={},
        observed_at=now,
    )
    session.add(finding)
    session.flush()
    return finding


def _seed_node(session, *, gpus: int, logs: int, incidents: int, name: str | None = None) -> Node:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    node = rows.node(session, name, state="suspect", state_reason="suspect in an incident")
    _gpus(session, node, gpus)
    _samples(session, node, gpus=gpus, at=now - timedelta(seconds=30))
    for i in range(logs):
        _log(session, node, kind="nccl_warn", line=f"NCCL WARN {i}", at=now - timedelta(seconds=logs - i))
    for i in range(incidents):
        job = rows.job(session)
        incident = rows.incident(session, job=job, suspects=[node.name] if i % 2 else [])
        if i % 2 == 0:
            _finding(session, incident=incident, node=node)
        session.add(
            NodeEvent(node_id=node.id, job_id=job.id, kind="suspect", actor="faultline", source="diagnosis", at=now)
        )
    session.flush()
    return node


def _table_rows(html: str, section: str) -> list[str]:
    body = html.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    return re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)[1:]


# --- the list ---------------------------------------------------------------------------------------------


def test_the_list_shows_each_node_with_its_state_job_and_gpus(ui, session) -> None:
    job = rows.job(session, "llm-pretrain-42")
    until = datetime.now(UTC) + timedelta(hours=2)
    bad = rows.node(
        session,
        "gpu-node-017",
        state="evicted",
        state_reason="Xid 79 (GPU has fallen off the bus) on GPU 3",
        lemon=True,
        quarantined_until=until,
        current_job_id=job.id,
    )
    _gpus(session, bad, 8)
    rows.node(session, "gpu-node-018")
    page = ui.get("/nodes")
    assert page.status_code == 200
    text = page.text
    assert 'href="/nodes/gpu-node-017"' in text and 'href="/nodes/gpu-node-018"' in text
    listed = next(r for r in re.findall(r"<tr>(.*?)</tr>", text, flags=re.S) if "gpu-node-017" in r)
    assert "state-evicted" in listed
    assert "Xid 79 (GPU has fallen off the bus) on GPU 3" in listed
    assert ">lemon<" in listed
    assert 'href="/jobs/llm-pretrain-42"' in listed
    assert until.isoformat()[:19] in listed  # the quarantine end, as a <time datetime=...>
    assert re.search(r'class="num">8</td>', listed)


def test_the_list_filters_by_state_lemon_and_name(ui, session) -> None:
    rows.node(session, "rack1-gpu-01", state="cordoned")
    rows.node(session, "rack1-gpu-02", lemon=True)
    rows.node(session, "rack2-gpu-01")
    names = lambda url: set(re.findall(r'href="/nodes/([^"]+)"', ui.get(url).text))  # noqa: E731
    assert names("/nodes?state=cordoned") == {"rack1-gpu-01"}
    assert names("/nodes?lemon=yes") == {"rack1-gpu-02"}
    assert names("/nodes?name=RACK1") == {"rack1-gpu-01", "rack1-gpu-02"}
    assert names("/nodes?name=rack2&lemon=no") == {"rack2-gpu-01"}
    # A LIKE wildcard in the filter is a character, not a pattern.
    assert names("/nodes?name=%25") == set()
    bad = ui.get("/nodes?state=broken")
    assert bad.status_code == 422 and "is not one of" in bad.text


def test_the_list_pages_with_a_cursor_keeping_the_filters(ui, session) -> None:
    for i in range(5):
        rows.node(session, f"pager-node-{i}", state="suspect")
    first = ui.get("/nodes?state=suspect&limit=2")
    assert re.findall(r'href="/nodes/(pager-node-\d)"', first.text) == ["pager-node-0", "pager-node-1"]
    link = re.search(r'href="\?([^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")
    assert "state=suspect" in link
    second = ui.get(f"/nodes?{link}&limit=2")
    assert re.findall(r'href="/nodes/(pager-node-\d)"', second.text) == ["pager-node-2", "pager-node-3"]


def test_the_list_sends_the_same_queries_for_3_or_30_nodes(ui, session, count_queries) -> None:
    counts = []
    for n in (3, 30):
        for _ in range(n - (0 if not counts else 3)):
            node = rows.node(session)
            _gpus(session, node, 2)
        with count_queries() as q:
            assert ui.get("/nodes").status_code == 200
        counts.append(q.count)
    assert counts[0] == counts[1]


# --- one node ---------------------------------------------------------------------------------------------


def test_the_node_page_shows_state_gpus_with_their_latest_counters_logs_incidents_and_history(ui, session) -> None:
    now = datetime.now(UTC)
    job = rows.job(session, "llm-pretrain-42")
    node = rows.node(
        session, "gpu-node-017", state="suspect", state_reason="suspect in incident: Xid 79", current_job_id=job.id
    )
    _gpus(session, node, 2)
    session.add_all([Rank(job_id=job.id, rank=r, node_id=node.id, local_rank=r, gpu_index=r) for r in (0, 1)])
    # GPU 0: an old sample, then the latest with row remaps and an Xid; GPU 1: only a sample too old to show.
    _samples(session, node, gpus=1, at=now - timedelta(minutes=2), gpu_util=11.0)
    _samples(
        session,
        node,
        gpus=1,
        at=now - timedelta(seconds=20),
        gpu_util=42.0,
        sm_active=0.875,
        gpu_temp=71.0,
        memory_temp=80.0,
        fb_used=40960.0,
        fb_free=40960.0,
        ecc_dbe_volatile=2.0,
        remapped_rows_uncorrectable=1.0,
        xid_last=79.0,
        nvlink_crc_flit_errors=3.0,
        nvlink_replay_errors=4.0,
    )
    session.execute(
        metric_samples.insert().values(ts=now - timedelta(minutes=30), node_id=node.id, gpu=1, gpu_util=55.0)
    )
    _log(session, node, kind="step", line="step 100 loss 2.31", at=now - timedelta(seconds=5), source="training")
    _log(session, node, kind="nccl_warn", line="NCCL WARN yesterday", at=now - timedelta(hours=25), source="training")
    _log(
        session,
        node,
        kind="watchdog_timeout",
        line="[Rank 3] Watchdog caught collective operation timeout\n  more detail",
        at=now - timedelta(seconds=50),
        source="training",
        severity="error",
        rank=3,
    )
    _log(
        session,
        node,
        kind="xid",
        line="NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', GPU has fallen off the bus.",
        at=now - timedelta(seconds=40),
        severity="critical",
        fields={"xid": 79, "mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"},
    )
    accused = rows.incident(session, job=job, suspects=[node.name], summary="Xid 79 on gpu-node-017")
    via_finding = rows.incident(session, job=job, root_cause="pcie", suspects=[], state="resolved")
    _finding(session, incident=via_finding, node=node)
    other = rows.incident(session, job=job, root_cause="hang", suspects=["gpu-node-099"])
    session.add(
        NodeEvent(
            node_id=node.id,
            job_id=job.id,
            incident_id=accused.id,
            kind="suspect",
            from_state="healthy",
            to_state="suspect",
            actor="faultline",
            source="diagnosis",
            reason="suspect in incident: Xid 79",
            at=now - timedelta(seconds=30),
        )
    )
    session.flush()

    page = ui.get("/nodes/gpu-node-017")
    assert page.status_code == 200
    html = page.text
    state = html.split('id="node-state"', 1)[1].split("</section>", 1)[0]
    assert "state-suspect" in state and "suspect in incident: Xid 79" in state
    assert 'href="/jobs/llm-pretrain-42"' in state

    gpus = _table_rows(html, "node-gpus")
    assert len(gpus) == 2
    assert "42%" in gpus[0] and "11%" not in gpus[0]  # the latest sample, not the older one
    assert "88%" in gpus[0]  # SM active, a ratio shown as a percentage
    assert "71 / 80 °C" in gpus[0] and "40.0 / 80.0 GiB" in gpus[0]
    assert re.search(r'class="num c-bad"[^>]*>\? / 2</td>', gpus[0])  # ECC SBE unknown / DBE 2
    assert re.search(r'class="num c-bad"[^>]*>79</td>', gpus[0])  # last Xid
    assert re.search(r'class="num c-bad"[^>]*title="crc flit errors 3[^"]*">7</td>', gpus[0])  # NVLink sum
    assert "no recent sample" in gpus[1] and "55%" not in gpus[1]

    logs = _table_rows(html, "node-logs")
    assert len(logs) == 2  # progress lines and events older than a day left out
    assert 'class="highlight xid"' in html.split('id="node-logs"', 1)[1]
    assert "fallen off the bus" in logs[0] and "xid 79" in logs[0]
    assert "Watchdog caught collective operation timeout" in logs[1] and "rank 3" in logs[1]
    assert "<details>" in logs[1] and "more detail" in logs[1]  # a multi-line event folds after its first line
    assert "step 100" not in html and "yesterday" not in html

    incidents = html.split('id="node-incidents"', 1)[1].split("</section>", 1)[0]
    linked = re.findall(r'href="/incidents/(\d+)">#', incidents)
    assert linked == [str(via_finding.id), str(accused.id)]  # newest first; not the incident naming another node
    assert str(other.id) not in linked
    assert "suspect 95%" in incidents and "in findings" in incidents

    history = html.split('id="node-history"', 1)[1].split("</section>", 1)[0]
    assert "suspect in incident: Xid 79" in history and f'href="/incidents/{accused.id}"' in history


def test_the_node_page_sends_the_same_queries_whatever_its_gpus_logs_and_incidents(ui, session, count_queries) -> None:
    small = _seed_node(session, gpus=2, logs=3, incidents=2)
    large = _seed_node(session, gpus=8, logs=60, incidents=20)
    counts = []
    for node in (small, large):
        with count_queries() as q:
            page = ui.get(f"/nodes/{node.name}")
        assert page.status_code == 200
        counts.append(q.count)
    assert len(_table_rows(page.text, "node-gpus")) == 8
    assert len(_table_rows(page.text, "node-logs")) == 50
    assert counts[0] == counts[1]


def test_an_unknown_node_is_a_404_page(ui) -> None:
    page = ui.get("/nodes/no-such-node")
    assert page.status_code == 404
    assert "no node named" in page.text


# --- the forms --------------------------------------------------------------------------------------------


def test_cordon_through_the_form_moves_the_node_and_records_the_operator(ui, session) -> None:
    node = rows.node(session, "gpu-node-021")
    form = ui.get("/nodes/gpu-node-021").text
    assert 'action="/nodes/gpu-node-021/cordon"' in form and 'action="/nodes/gpu-node-021/return"' not in form
    response = ui.post("/nodes/gpu-node-021/cordon", {"reason": "fans failing, ticket HW-4411"})
    assert response.status_code == 303 and response.headers["location"] == "/nodes/gpu-node-021"
    session.refresh(node)
    assert node.state == "cordoned" and node.state_reason == "fans failing, ticket HW-4411"
    event = session.scalars(select(NodeEvent).where(NodeEvent.node_id == node.id)).one()
    assert (event.kind, event.actor, event.to_state) == ("cordon", "operator:oncall-op", "cordoned")
    decision = session.scalars(select(Decision).where(Decision.node_id == node.id)).one()
    assert (decision.kind, decision.state, decision.actor) == ("cordon", "pending", "operator:oncall-op")
    after = ui.get("/nodes/gpu-node-021").text
    assert "gpu-node-021 cordoned: it is now cordoned." in after
    assert 'action="/nodes/gpu-node-021/repair"' in after and 'action="/nodes/gpu-node-021/return"' in after


def test_a_return_refused_by_the_quarantine_says_why_and_changes_nothing(ui, session) -> None:
    until = datetime.now(UTC) + timedelta(hours=1)
    node = rows.node(session, "gpu-node-017", state="evicted", quarantined_until=until)
    form = ui.get("/nodes/gpu-node-017").text
    assert "returning now needs force" in form
    response = ui.post("/nodes/gpu-node-017/return", {"reason": "GPU 3 replaced"})
    assert response.status_code == 303
    page = ui.get(response.headers["location"])
    # In the form's terms (issue 40), not the API's "pass force=true ... until 2026-...T...+00:00".
    assert "Not done: gpu-node-017 is quarantined until" in page.text and re.search(r"UTC \(in \d+ min\)", page.text)
    assert "Tick “force” to return it now" in page.text and "force=true" not in page.text
    session.refresh(node)
    assert node.state == "evicted" and node.quarantined_until == until
    assert session.scalar(select(func.count()).select_from(NodeEvent).where(NodeEvent.node_id == node.id)) == 0
    assert session.scalar(select(func.count()).select_from(Decision).where(Decision.node_id == node.id)) == 0


def test_a_forced_return_with_passing_diagnostics_is_recorded_with_them(ui, session) -> None:
    node = rows.node(
        session, "gpu-node-017", state="in_repair", lemon=True, quarantined_until=datetime.now(UTC) + timedelta(days=3)
    )
    response = ui.post(
        "/nodes/gpu-node-017/return",
        {
            "reason": "GPU swapped",
            "force": "true",
            "diagnostics_passed": "true",
            "diagnostics_tool": "dcgmi diag -r 3",
            "diagnostics_report": "all tests passed",
        },
    )
    assert "returned to service (forced)" in ui.get(response.headers["location"]).text
    session.refresh(node)
    assert node.state == "healthy" and node.quarantined_until is None
    event = session.scalars(
        select(NodeEvent).where(NodeEvent.node_id == node.id).order_by(NodeEvent.id.desc()).limit(1)
    ).one()
    assert event.kind == "return_forced" and event.actor == "operator:oncall-op"
    assert event.details == {
        "diagnostics": {"passed": True, "tool": "dcgmi diag -r 3", "report": "all tests passed", "ran_at": None}
    }


def test_a_lemon_without_diagnostics_and_a_missing_reason_are_refused_with_the_reason(ui, session) -> None:
    suspect = rows.node(session, "gpu-node-032", state="suspect", lemon=True)
    no_diag = ui.post("/nodes/gpu-node-032/return", {"reason": "looks fine"})
    refused = ui.get(no_diag.headers["location"]).text
    assert "Not done" in refused and "passing diagnostics" in refused
    session.refresh(suspect)
    assert suspect.state == "suspect"
    node = rows.node(session, "gpu-node-033", state="cordoned", lemon=True)
    no_reason = ui.post("/nodes/gpu-node-033/repair", {"reason": "  "})
    assert "give a reason" in ui.get(no_reason.headers["location"]).text
    wrong_state = ui.post("/nodes/gpu-node-033/cordon", {"reason": "again"})
    assert "it is now cordoned" in ui.get(wrong_state.headers["location"]).text  # cordoning twice is harmless
    session.refresh(node)
    assert node.state == "cordoned"
    assert session.scalar(select(func.count()).select_from(NodeEvent).where(NodeEvent.node_id == node.id)) == 0


def test_a_return_without_diagnostics_runs_the_gate_first(ui, session) -> None:
    """Out of service, a lemon too: the node is returning while its agent runs the checks; a pass gives it back."""
    node = rows.node(session, "gpu-node-034", state="cordoned", lemon=True)
    response = ui.post("/nodes/gpu-node-034/return", {"reason": "fans replaced"})
    page = ui.get(response.headers["location"]).text
    assert "it is now returning" in page and "return gate" in page
    session.refresh(node)
    assert node.state == "returning"
    gate = session.scalars(select(Directive).where(Directive.node_id == node.id)).one()
    assert gate.params["return_on_pass"] is True and gate.params["level"] == 2 and gate.params["undrain"] is True


def test_repair_of_a_healthy_node_is_refused_and_an_unknown_node_says_so(ui, session) -> None:
    node = rows.node(session, "gpu-node-040")
    refused = ui.post("/nodes/gpu-node-040/repair", {"reason": "RMA"})
    assert "only a suspect or out-of-service node goes to repair" in ui.get(refused.headers["location"]).text
    session.refresh(node)
    assert node.state == "healthy"
    unknown = ui.post("/nodes/nope-404/cordon", {"reason": "x"})
    assert "no node named" in ui.get(unknown.headers["location"]).text


def test_the_forms_need_the_csrf_token(ui, session) -> None:
    node = rows.node(session, "gpu-node-050")
    response = ui.client.post("/nodes/gpu-node-050/cordon", data={"reason": "x"}, follow_redirects=False)
    assert response.status_code == 403
    session.refresh(node)
    assert node.state == "healthy"


def test_a_log_row_from_the_year_10000_does_not_break_the_node_page(ui, session) -> None:
    """Stored before ingest refused such times, it cannot be read back by Python: the page reads around it."""
    node = rows.node(session, "gpu-node-099")
    common = {"node_id": node.id, "source": "kmsg", "kind": "xid", "batch_id": uuid.uuid4()}
    session.add(LogEvent(ts=datetime.now(UTC), line="NVRM: Xid 79", **common))
    session.flush()
    session.execute(
        text(
            "INSERT INTO log_events (ts, node_id, source, kind, line, batch_id) "
            "VALUES ('10000-01-01 00:00:00+00', :node, 'kmsg', 'xid', 'far future', :batch)"
        ),
        {"node": node.id, "batch": common["batch_id"]},
    )
    page = ui.client.get("/nodes/gpu-node-099")
    assert page.status_code == 200 and "NVRM: Xid 79" in page.text and "far future" not in page.text


def test_the_node_page_shows_its_ports_host_and_volumes(ui, session) -> None:  # type: ignore[no-untyped-def]
    node = Node(name=f"net-node-{uuid.uuid4().hex[:6]}")
    session.add(node)
    session.flush()
    now = datetime.now(UTC)
    _gpus(session, node, 1)
    _samples(session, node, gpus=1, at=now, pcie_link_gen=5.0, pcie_link_width=8.0, pcie_max_link_gen=5.0,
             pcie_max_link_width=16.0, row_remap_pending=1.0)  # fmt: skip
    ports = [
        {"subject": "ib:mlx5_0/1", "port_state": 4.0, "port_rate_gbps": 400.0, "link_downed": 0.0, "symbol_error": 0.0},
        {"subject": "ib:mlx5_1/1", "port_state": 1.0, "port_rate_gbps": 400.0, "link_downed": 3.0, "symbol_error": 17},
        {"subject": "host", "mem_total_mib": 2e6, "mem_available_mib": 4e4, "psi_mem_some_avg10": 35.0,
         "psi_mem_full_avg10": 9.0, "cpu_util_pct": 41.0},
        {"subject": "vol:/checkpoints", "disk_free_bytes": 2.0 * 2**40, "disk_free_pct": 40.0},
    ]  # fmt: skip
    columns = {c for p in ports for c in p}
    session.execute(
        node_samples.insert(), [dict.fromkeys(columns) | {"ts": now, "node_id": node.id} | p for p in ports]
    )
    session.flush()
    html = ui.client.get(f"/nodes/{node.name}").text
    machine = html[html.index('id="node-machine"') :]
    assert machine.index("host") < machine.index("ib:mlx5_0/1") < machine.index("vol:/checkpoints")
    assert re.search(r'class="c-bad"[^>]*>DOWN<', machine)  # the dead port stands out
    assert "39.1 GiB of 1,953 GiB" in machine and "35.0% / 9.0%" in machine and "2,048.0 GiB (40%)" in machine
    gpus = html[html.index('id="node-gpus"') : html.index('id="node-machine"')]
    assert re.search(r'c-bad"[^>]*>gen 5 x8<', gpus)  # a link narrower than it can be


def _acked_eviction(session, node: Node, *, reason: str, at: datetime) -> None:  # type: ignore[no-untyped-def]
    from service.config import get_settings
    from service.decisions.lifecycle import acknowledge

    incident = rows.incident(session, job=rows.job(session), suspects=[node.name], root_cause=f"c{at.timestamp()}")
    decision = rows.decision(session, incident=incident, node=node, reason=reason)
    acknowledge(
        session, decision_id=decision.id, outcome="done", message="drained", actor="scheduler:s", now=at,
        settings=get_settings(),
    )  # fmt: skip


def test_the_state_box_shows_the_latest_eviction(ui, session) -> None:
    """node-005 of the demo, evicted for NVLink errors, then again for a double-bit ECC error on another GPU while
    nobody had told faultline it came back: the state box showed the first eviction."""
    node = rows.node(session, "gpu-node-005")
    now = datetime.now(UTC)
    _acked_eviction(session, node, reason="evict gpu-node-005: NVLink errors on GPU 2", at=now - timedelta(minutes=22))
    _acked_eviction(session, node, reason="evict gpu-node-005: double-bit ECC error on GPU 6", at=now)
    html = ui.get("/nodes/gpu-node-005").text
    state = html[html.index('id="node-state"') : html.index('id="node-actions"')]
    assert "double-bit ECC error" in state and "NVLink" not in state
    assert "22 min" not in state  # since the second eviction, not the first
    last = state[state.index('id="last-eviction"') :]
    assert "<b>GPU 6</b>" in last and "double-bit ECC error" in last


def test_a_node_at_work_before_its_gate_says_so_loudly(ui, session) -> None:
    from service.nodes import returns

    job = rows.job(session, "job-early")
    node = rows.node(session, "gpu-node-009", state="evicted")
    returns.placed_before_gate(
        session, node=node, job_id=job.id, job="job-early", how="a rank map", now=datetime.now(UTC)
    )
    session.flush()
    html = ui.get("/nodes/gpu-node-009").text
    assert 'class="pill before-gate"' in html
    banner = html[html.index('id="before-gate"') :]
    assert "Running work before its return gate" in banner and "job-early" in banner
    assert "state-returning" in html
    # As loud on the overview (first among the nodes that need a person) and on the job's page.
    overview = ui.get("/").text
    needs = overview[overview.index('id="nodes-attention"') :]
    first = needs[needs.index("<tbody>") :]
    assert first.index('data-node="gpu-node-009"') < first.index("</tr>")
    assert "running work before its gate" in first and "watch its checks" in first
    job_page = ui.get("/jobs/job-early").text
    banner = job_page[job_page.index('id="before-gate-gpu-node-009"') :]
    assert "runs this job's work before its return gate" in banner and "(evicted)" in banner
