"""The incident page: what broke, on which machine, why faultline thinks so, what it did, and overruling it."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.models import Decision, Finding, Incident, Job, LogEvent, Node, Silence, StackDump
from service.ui.views import incident as view
from tests import rows

T0 = datetime(2026, 11, 22, 21, 32, 0, tzinfo=UTC)
XID_LINE = (
    "[Sun Nov 22 21:32:14 2026] NVRM: Xid (PCI:0000:43:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)
WATCHDOG = (
    "[rank{r}]:[E1122 21:32:34.615265 8334 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=118226, OpType=ALLREDUCE) ran for 20053 milliseconds before timing out."
)
CULPRIT_FRAMES = [
    "DataLoaderIter._get_data (rank.py)",
    "DataLoaderIter._next_data (rank.py)",
    "DataLoaderIter.__next__ (rank.py)",
    "train_step (rank.py)",
    "train (rank.py)",
    "main (rank.py)",
]


def _chain(names: list[str], count: int, leaf: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A tree branch: names outermost first, each the only child of the one before."""
    node: dict[str, Any] = {"name": names[-1], "count": count, "children": leaf or []}
    for name in reversed(names[:-1]):
        node = {"name": name, "count": count, "children": [node]}
    return node


def stack_tree(ranks: int) -> dict[str, Any]:
    """As ml.stacks writes it: every rank's stack merged, outermost frame first."""
    waiting = _chain(["backward (rank.py)", "all_reduce (rank.py)", "_wait_for_work (rank.py)"], ranks - 1)
    loading = _chain(
        [
            "DataLoaderIter.__next__ (rank.py)",
            "DataLoaderIter._next_data (rank.py)",
            "DataLoaderIter._get_data (rank.py)",
        ],
        1,
    )
    shared = _chain(["main (rank.py)", "train (rank.py)", "train_step (rank.py)"], ranks)
    shared["children"][0]["children"][0]["children"] = [waiting, loading]
    return {"name": "all ranks", "count": ranks, "children": [shared]}


class Seeded:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def seed(session: Session, *, extra: int = 0, state: str = "mitigating") -> Seeded:
    """A hang after a GPU fell off the bus: Xid lines, watchdog timeouts on every rank, a stacks analysis
    naming the culprit, a peers outlier, a fail-slow rank and a counters finding; `extra` adds that many more
    symptom findings and log lines (for query counting)."""
    tag = uuid.uuid4().hex[:6]
    job = rows.job(session, f"llm-{tag}")
    nodes = [rows.node(session, f"gpu-{tag}-{i:03d}", current_job_id=job.id) for i in range(4)]
    culprit, other = nodes[1], nodes[2]
    outsider = rows.node(session, f"spare-{tag}")  # runs no job: not an override choice
    incident = Incident(
        job_id=job.id,
        root_cause="gpu_hardware",
        blame="infrastructure",
        severity="critical",
        confidence=0.97,
        summary=f"gpu hardware: Xid 79 (GPU has fallen off the bus) on {culprit.name}",
        state=state,
        opened_at=T0 + timedelta(seconds=15),
        updated_at=T0 + timedelta(seconds=40),
    )
    session.add(incident)
    session.flush()
    batch = uuid.uuid4()

    def log(node: Node, seconds: float, kind: str, line: str, rank: int | None = None, source: str = "training") -> int:
        row = LogEvent(
            batch_id=batch,
            node_id=node.id,
            job_id=job.id,
            ts=T0 + timedelta(seconds=seconds),
            source=source,
            kind=kind,
            severity="critical" if kind == "xid" else "error",
            rank=rank,
            line=line,
        )
        session.add(row)
        session.flush()
        return row.id

    xid = log(culprit, 14, "xid", XID_LINE, source="kmsg")
    timeouts = [log(nodes[r % 4], 34 + r / 1000, "watchdog_timeout", WATCHDOG.format(r=r), rank=r) for r in range(8)]
    more = [log(nodes[r % 4], 36 + r / 1000, "crash", f"extra line {r}", rank=r) for r in range(extra)]
    dump = StackDump(batch_id=batch, node_id=culprit.id, job_id=job.id, ts=T0 + timedelta(seconds=60), rank=1, pid=4242)
    session.add(dump)
    session.flush()

    def finding(node: Node | None, detector: str, category: str, evidence: dict[str, Any], **values: Any) -> Finding:
        row = Finding(
            dedup_key=f"{tag}:{detector}:{category}:{uuid.uuid4().hex}",
            job_id=job.id,
            incident_id=incident.id,
            node_id=node.id if node else None,
            detector=detector,
            category=category,
            subject_kind=values.pop("subject_kind", "node" if node else "job"),
            subject=values.pop("subject", node.name if node else job.external_id),
            confidence=values.pop("confidence", 0.9),
            summary=values.pop("summary", f"{detector} says {category}"),
            blame=values.pop("blame", "infrastructure"),
            role=values.pop("role", "cause"),
            action=values.pop("action", "evict"),
            evidence=evidence,
            observed_at=values.pop("observed_at", T0 + timedelta(seconds=14)),
        )
        session.add(row)
        session.flush()
        return row

    xid_finding = finding(
        culprit,
        "signatures",
        "gpu_hardware",
        {"xid": 79, "count": 1, "signals": [{"type": "log", "id": xid}], "lines": [XID_LINE]},
        subject_kind="gpu",
        subject=f"{culprit.name}/0000:43:00",
        confidence=0.97,
        summary=f"Xid 79 (GPU has fallen off the bus) on {culprit.name} GPU 0000:43:00",
    )
    window = [T0 + timedelta(seconds=30 * i) for i in range(5)]
    peers_finding = finding(
        culprit,
        "peers",
        "straggler",
        {
            "unit": f"{culprit.name}/1",
            "window_s": 30.0,
            "signals": [
                {
                    "type": "metric",
                    "node": culprit.name,
                    "gpu": 1,
                    "metric": "power_usage",
                    "from": window[0].isoformat(),
                }
            ],
            "metrics": [
                {
                    "metric": "power_usage",
                    "direction": "low",
                    "score": 4.85,
                    "windows": [  # latest first, as ml.peers writes them
                        {
                            "start": window[i].isoformat(),
                            "end": window[i + 1].isoformat(),
                            "value": 365.5 + i,
                            "z": -4.9,
                            "peer_median": 486.0 - i,
                            "peer_p10": 472.5,
                            "peer_p90": 494.4,
                            "n_units": 32,
                        }
                        for i in reversed(range(4))
                    ],
                }
            ],
        },
        subject_kind="gpu",
        subject=f"{culprit.name}/1",
        confidence=0.89,
        summary=f"{culprit.name} GPU 1 is its peers' outlier for 120 s (low power_usage: 365.5 vs peers 486)",
    )
    stacks_finding = finding(
        culprit,
        "stacks",
        "hang",
        {
            "why": "rank 1 in data loading (DataLoaderIter._get_data) while 7 of 8 ranks wait in _wait_for_work",
            "method": "named",
            "dominant": "40d2026a72a7",
            "dominant_state": "collective",
            "culprit_ranks": "1",
            "culprit_state": "data",
            "culprit_frames": CULPRIT_FRAMES,
            "covering_group": None,
            "unreported": "",
            "ranks_reporting": 8,
            "signals": [{"type": "stack", "id": dump.id}],
            "signals_omitted": 7,
            "stack_request": str(uuid.uuid4()),
            "groups": [
                {
                    "signature": "40d2026a72a7",
                    "state": "collective",
                    "op": "_wait_for_work (rank.py)",
                    "ranks": "0,2-7",
                    "count": 7,
                    "node_count": 4,
                    "nodes": [n.name for n in nodes],
                    "frames": ["_wait_for_work (rank.py)", "all_reduce (rank.py)", "backward (rank.py)"],
                },
                {
                    "signature": "46efcdc0c9b7",
                    "state": "data",
                    "op": "DataLoaderIter._get_data (rank.py)",
                    "ranks": "1",
                    "count": 1,
                    "node_count": 1,
                    "nodes": [culprit.name],
                    "frames": CULPRIT_FRAMES,
                },
            ],
            "tree": stack_tree(8),
        },
        confidence=0.9,
        observed_at=T0 + timedelta(seconds=61),
        summary=f"{culprit.name}: rank 1 in data loading while 7 of 8 ranks wait in _wait_for_work",
    )
    finding(
        other,
        "failslow",
        "straggler",
        {
            "rank": 5,
            "ratio": 1.4,
            "signals": [{"type": "log", "id": timeouts[5]}],
            "rounds": [
                {
                    "start": window[i].isoformat(),
                    "end": window[i + 1].isoformat(),
                    "rank_ms": 1400.0 + i,
                    "ratio": 1.4,
                    "z": 6.0,
                    "peer_median": 1000.0,
                    "peer_p10": 990.0,
                    "peer_p90": 1010.0,
                    "n_peers": 7,
                }
                for i in reversed(range(4))
            ],
        },
        subject_kind="rank",
        subject="rank 5",
        confidence=0.6,
        action="diagnose",
        summary="rank 5 takes 1.40x its peers' step time in all 4 rounds",
    )
    finding(
        culprit,
        "counters",
        "pcie",
        {
            "gpus": [1],
            "errors": 43,
            "per_minute": 86.0,
            "peer_median": 0.0,
            "signals": [
                {
                    "ts": (T0 + timedelta(seconds=13)).isoformat(),
                    "gpu": 1,
                    "node": culprit.name,
                    "type": "metric",
                    "metric": "pcie_replay",
                }
            ],
        },
        confidence=0.5,
        action="diagnose",
        summary=f"PCIe replays on {culprit.name} GPU 1: +43 (86/min) vs a job median of 0",
    )
    finding(
        None,
        "signatures",
        "job_failure",
        {"count": 8, "signals": [{"type": "log", "id": i} for i in timeouts + more]},
        role="symptom",
        action="none",
        confidence=0.3,
        blame="unknown",
        observed_at=T0 + timedelta(seconds=34),
        summary="NCCL watchdog timeouts on 8 ranks",
    )
    for k in range(extra):
        finding(
            nodes[k % 4],
            "signatures",
            "job_failure",
            {"signals": [{"type": "log", "id": more[k]}]},
            role="symptom",
            action="none",
            confidence=0.3,
            summary=f"extra symptom {k}",
        )
    incident.suspects = [
        {
            "node": culprit.name,
            "confidence": 0.97,
            "action": "evict",
            "reason": "Xid 79 (GPU has fallen off the bus) on GPU 0000:43:00",
            "finding_ids": [xid_finding.id, peers_finding.id, stacks_finding.id],
        }
    ]
    session.flush()
    decision = Decision(
        incident_id=incident.id,
        job_id=job.id,
        node_id=culprit.id,
        kind="evict",
        state="awaiting_approval",
        confidence=0.97,
        reason=f"evict {culprit.name}: Xid 79 (GPU has fallen off the bus)",
        evidence={"incident_id": incident.id, "findings": [{"id": xid_finding.id}]},
        created_at=T0 + timedelta(seconds=16),
        expires_at=datetime.now(UTC) + timedelta(minutes=30),
    )
    session.add(decision)
    session.flush()
    return Seeded(
        job=job, nodes=nodes, culprit=culprit, outsider=outsider, incident=incident, decision=decision, dump=dump
    )


def section(html: str, anchor: str) -> str:
    """The HTML of one section of the page, by its id."""
    start = html.index(f'id="{anchor}"')
    return html[start : html.index("</section>", start)]


def test_the_page_shows_what_broke_where_and_why(ui, session) -> None:
    s = seed(session)
    response = ui.get(f"/incidents/{s.incident.id}")
    assert response.status_code == 200
    html = response.text
    head = section(html, "headline")
    assert f"#{s.incident.id} · gpu hardware" in head
    assert "critical" in head and "infrastructure" in head and "mitigating" in head
    assert f'href="/jobs/{s.job.external_id}"' in head
    assert "1 decision waits on someone" in head

    suspects = section(html, "suspects")
    assert f'href="/nodes/{s.culprit.name}"' in suspects
    assert "Xid 79 (GPU has fallen off the bus) on GPU 0000:43:00" in suspects  # the suspect's reason
    # Its evidence: the three findings it lists, each with detector and role.
    for detector in ("signatures · gpu_hardware", "peers · straggler", "stacks · hang"):
        assert detector in suspects
    assert suspects.count('class="pill role-cause"') == 3

    # The peers plot: band, dashed median and the suspect's line; the fail-slow rank plotted the same way.
    plots = section(html, "plots")
    power = plots[plots.index('data-metric="power_usage"') :]
    assert re.search(r'<polygon class="band" points="[\d., ]+"/>', power)
    assert re.search(r'<path class="median" d="M[\d.,HV]+"/>', power)
    assert re.search(r'<path class="suspect" d="M[\d.,HV]+"/>', power)
    assert "power_usage · W" in power and "21:32:00" in power
    assert 'data-metric="step time"' in plots and "rank 5" in plots

    stacks = section(html, "stacks")
    assert "rank 1 in data loading (DataLoaderIter._get_data)" in stacks  # why
    outlier_row = re.search(r'<tr class="highlight">(.*?)</tr>', stacks, re.S)
    assert outlier_row and "46efcdc0c9b7" in outlier_row.group(1) and "outlier" in outlier_row.group(1)
    dominant_row = re.search(r'<tr class="">(.*?)</tr>', stacks, re.S)
    assert dominant_row and "40d2026a72a7" in dominant_row.group(1)
    # The tree, with the culprit's leaf on a highlighted path and the waiting ranks' leaf not.
    assert re.search(
        r'<li class="outlier">\s*<span class="n">1</span> <span class="frame">DataLoaderIter._get_data', stacks
    )
    assert re.search(r'<li class="">\s*<span class="n">7</span> <span class="frame">_wait_for_work', stacks)

    findings = section(html, "findings")
    assert "per minute</span> 86" in findings  # the counters finding's numbers
    logs = section(html, "logs")
    assert "GPU has fallen off the bus." in logs and "kmsg · xid" in logs
    assert "watchdog_timeout" in logs and "8 lines on 4 nodes" in logs

    timeline = section(html, "timeline")
    assert "kmsg xid" in timeline and "\u00d78" in timeline  # eight ranks' timeouts within a second: one line
    assert f"decision #{s.decision.id}: evict {s.culprit.name} proposed" in timeline
    assert f"incident #{s.incident.id} opened" in timeline and "stack dump of rank 1" in timeline
    assert "metric power_usage" in timeline and "metric pcie_replay" in timeline
    order = [
        timeline.index(t)
        for t in ("kmsg xid", f"incident #{s.incident.id} opened", "watchdog_timeout", "stacks · hang")
    ]
    assert order == sorted(order)

    decisions = section(html, "decisions")
    assert f'action="/decisions/{s.decision.id}/approve"' in decisions and ">Approve</button>" in decisions
    assert f'name="return_to" value="/incidents/{s.incident.id}"' in decisions
    # Override offers the suspect first, then the job's other nodes; not nodes outside the job.
    options = re.findall(r'<option value="([^"]+)"', decisions.split('name="node"')[1].split("</select>")[0])
    assert options[0] == s.culprit.name
    assert sorted(options[1:]) == sorted(n.name for n in s.nodes if n is not s.culprit)
    assert s.outsider.name not in options


def test_findings_whose_evidence_is_unreadable_are_listed_without_it(ui, session) -> None:
    """A malformed or older evidence row shows its finding but none of the evidence, and never an error page."""
    s = seed(session)
    page = f"/incidents/{s.incident.id}"
    before = ui.get(page).text
    signal = {"type": "metric", "node": s.culprit.name, "gpu": 1, "metric": "bogus_metric", "ts": T0.isoformat()}
    for detector, evidence in (
        ("stacks", {"groups": "garbage", "tree": {"name": 3}, "why": "an unreadable analysis"}),
        ("peers", {"unit": f"{s.culprit.name}/1", "metrics": {"power_usage": 1}, "window_s": "30"}),
        ("failslow", {"rounds": [{"start": 1, "rank_ms": 5.0}], "ratio": 9.75}),
        ("counters", {"signals": [signal], "errors": "many", "per_minute": 12345.0}),
    ):
        session.add(
            Finding(
                dedup_key=f"unreadable:{detector}:{uuid.uuid4().hex}",
                job_id=s.job.id,
                incident_id=s.incident.id,
                node_id=s.culprit.id,
                detector=detector,
                category="unknown",
                subject_kind="node",
                subject=s.culprit.name,
                confidence=0.2,
                summary=f"unreadable {detector} evidence",
                blame="unknown",
                role="symptom",
                action="none",
                evidence=evidence,
                observed_at=T0 + timedelta(seconds=20),
            )
        )
    session.flush()
    response = ui.get(page)
    assert response.status_code == 200
    html = response.text
    findings = section(html, "findings")
    for detector in ("stacks", "peers", "failslow", "counters"):
        assert f"unreadable {detector} evidence" in findings
    assert "1.234e+04" not in findings and "9.75" not in findings  # their numbers are not shown
    assert section(html, "plots") == section(before, "plots")
    assert section(html, "stacks") == section(before, "stacks")
    assert "metric bogus_metric" in section(html, "timeline")  # each signal reference stands on its own


def test_approving_from_the_page_sends_the_eviction_to_schedulers(ui, session) -> None:
    s = seed(session)
    back = f"/incidents/{s.incident.id}"
    response = ui.post(f"/decisions/{s.decision.id}/approve", {"return_to": back}, htmx=True)
    assert response.status_code == 200
    assert f'id="decision-{s.decision.id}"' in response.text and "approved" in response.text
    session.expire_all()
    decision = session.get(Decision, s.decision.id)
    assert decision.state == "pending" and decision.actor == "operator:oncall-op"
    page = ui.get(back).text
    assert "approved by operator:oncall-op" in section(page, "timeline")
    assert ">Approve</button>" not in section(page, "decisions")
    # A plain form post (no htmx) comes back to the incident with a message.
    rejected = ui.post(f"/decisions/{s.decision.id}/reject", {"return_to": back, "message": "known flaky, keep it"})
    assert rejected.status_code == 303 and rejected.headers["location"] == back
    session.expire_all()
    assert session.get(Decision, s.decision.id).state == "rejected"
    timeline = section(ui.get(back).text, "timeline")
    assert "rejected by operator:oncall-op" in timeline and "known flaky, keep it" in timeline


def test_an_unknown_incident_is_a_404_page(ui) -> None:
    response = ui.get("/incidents/987654321")
    assert response.status_code == 404
    assert "There is no incident #987654321 yet" in response.text and "<html" in response.text


def test_strangers_are_sent_to_sign_in(client, session) -> None:
    s = seed(session)
    response = client.get(f"/incidents/{s.incident.id}", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == f"/login?next=/incidents/{s.incident.id}"


def test_a_resolved_incident_says_how_it_ended(ui, session) -> None:
    s = seed(session, state="resolved")
    s.decision.state, s.decision.outcome, s.decision.actor = "done", "done", "scheduler:slurm"
    s.decision.acked_at = T0 + timedelta(seconds=90)
    s.decision.outcome_message = "drained and evicted"
    s.incident.resolved_at = T0 + timedelta(seconds=95)
    s.incident.resolution = f"mitigated: evict {s.culprit.name} done"
    session.flush()
    html = ui.get(f"/incidents/{s.incident.id}").text
    head = section(html, "headline")
    assert "Resolved" in head and f"mitigated: evict {s.culprit.name} done" in head
    assert "waits on someone" not in head
    timeline = section(html, "timeline")
    assert f"evict {s.culprit.name} done by scheduler:slurm" in timeline and "drained and evicted" in timeline
    assert timeline.index("drained and evicted") < timeline.rindex("resolved")
    assert ">Approve</button>" not in html and ">Reject</button>" not in section(html, "decisions")


def test_a_silenced_incident_names_its_silence(ui, session) -> None:
    s = seed(session)
    silence = Silence(
        node_pattern=s.culprit.name,
        starts_at=T0,
        ends_at=datetime.now(UTC) + timedelta(hours=2),
        author="alice",
        comment="firmware update on this host",
    )
    session.add(silence)
    session.flush()
    s.incident.silence_id = silence.id
    session.flush()
    head = section(ui.get(f"/incidents/{s.incident.id}").text, "headline")
    assert f"silence #{silence.id}" in head and "firmware update on this host" in head


def test_an_incident_without_suspects_or_decisions_still_reads(ui, session) -> None:
    job = rows.job(session)
    incident = rows.incident(session, job=job, root_cause="user_code", blame="user_code", state="open")
    html = ui.get(f"/incidents/{incident.id}").text
    assert "names no machine" in section(html, "suspects")
    assert "No decision was made" in section(html, "decisions")
    assert 'id="plots"' not in html and 'id="stacks"' not in html
    assert "No log line is cited" in section(html, "logs")


def test_the_page_costs_the_same_queries_for_3_or_30_findings_and_log_lines(ui, session, count_queries) -> None:
    small, big = seed(session, extra=0), seed(session, extra=30)
    ui.get(f"/incidents/{small.incident.id}")  # warm up: the session lookup and templates
    counts = []
    for s in (small, big):
        with count_queries() as q:
            response = ui.get(f"/incidents/{s.incident.id}")
        assert response.status_code == 200
        counts.append(q.count)
    assert "extra line 29" in response.text and "extra symptom 29" in response.text
    assert counts[0] == counts[1], counts
    # sign-in lookup + incident, job, findings, decisions, logs, stacks, nodes, GPUs, signals, earlier incidents of
    # the same root cause on its nodes (repeat failures: one query when there are none), its evidence bundles, the
    # fleet breaker's row and the open shared incidents (every page's banners)
    assert counts[0] <= 18, counts


def test_the_culprit_path_is_found_from_the_leaf_even_through_a_cut() -> None:
    tree = stack_tree(8)
    root = view.stack_tree(tree, CULPRIT_FRAMES)
    assert root is not None
    marked: list[str] = []

    def walk(node: view.TreeNode) -> None:
        if node.outlier:
            marked.append(node.name)
        for child in node.children:
            walk(child)

    walk(root)
    assert marked == list(reversed(CULPRIT_FRAMES))
    # The shared frames are on the path but everyone is there; the divergent ones are the culprit's own.
    shared = {n for n in marked if n in ("main (rank.py)", "train (rank.py)", "train_step (rank.py)")}
    assert len(shared) == 3
    # ml.stacks replaces the middle of a very deep stack by '... N frames ...'; the path is still found.
    deep = {
        "name": "all ranks",
        "count": 2,
        "children": [_chain(["main", "... 30 frames ...", "inner", "leaf"], 1), _chain(["main2", "other"], 1)],
    }
    root = view.stack_tree(deep, ["leaf", "inner", "f30", "f29"])
    assert root is not None and root.children[0].outlier and not root.children[1].outlier
    # Garbage and depth: no tree from a non-dict; a 500-deep chain is cut, not a recursion error.
    assert view.stack_tree("nope", []) is None
    chain = _chain([f"f{i}" for i in range(500)], 1)
    root = view.stack_tree({"name": "all ranks", "count": 1, "children": [chain]}, [])
    depth, node = 0, root
    while node.children:
        node, depth = node.children[0], depth + 1
    assert depth == view.TREE_DEPTH and node.cut


def test_evidence_numbers_are_short_and_readable() -> None:
    pairs = dict(
        view.numbers(
            {
                "xid": 79,
                "per_minute": 86.0,
                "gpus": [1, 3],
                "last_step_at": "2026-11-22T21:32:14.054000+00:00",
                "signals": [{"type": "log", "id": 1}],
                "lines": ["long"],
                "signature": "e52034e146b368a4",
                "job_progressing": False,
                "tree": {"name": "all ranks"},
            }
        )
    )
    assert pairs == {
        "xid": "79",
        "per minute": "86",
        "gpus": "1, 3",
        "last step at": "2026-11-22 21:32:14 UTC",
        "job progressing": "no",
    }


def test_an_incident_of_another_job_is_not_mixed_in(ui, session) -> None:
    """Two incidents side by side: each page shows its own job's nodes and evidence only."""
    a, b = seed(session), seed(session)
    html = ui.get(f"/incidents/{a.incident.id}").text
    assert a.culprit.name in html and b.culprit.name not in html
    assert session.get(Job, b.job.id) is not None


def test_a_long_timeline_drops_late_signals_but_keeps_findings_and_decisions() -> None:
    entries = [view.Entry(at=T0 + timedelta(seconds=i), kind="signal", title=f"s{i}") for i in range(10)]
    entries.insert(8, view.Entry(at=T0 + timedelta(seconds=8), kind="decision", title="decision #1"))
    kept, omitted = view.capped(entries, 5)
    assert [e.title for e in kept] == ["s0", "s1", "s2", "s3", "decision #1"]
    assert omitted == 6
    assert view.capped(entries, 50) == (entries, 0)


def test_a_stall_no_machine_explains_yet_reads_localizing(ui, session) -> None:
    """No accusation spray: a straggler incident whose evidence separates no machine says "localizing" rather
    than listing suspects; the same incident resolved, or a user's bug, does not."""
    job = rows.job(session)
    stall = rows.incident(session, job=job, root_cause="straggler", blame="unknown", state="open")
    html = ui.get(f"/incidents/{stall.id}").text
    assert "localizing" in section(html, "headline") and "does not separate one machine" in section(html, "suspects")
    bug = rows.incident(session, job=job, root_cause="user_code", blame="user_code", state="open")
    assert "localizing" not in ui.get(f"/incidents/{bug.id}").text
    stall.state = "resolved"
    session.flush()
    assert "localizing" not in ui.get(f"/incidents/{stall.id}").text
