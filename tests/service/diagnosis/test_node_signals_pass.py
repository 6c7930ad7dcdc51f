"""Machine-level signals in diagnosis: node samples rolled up into node windows, the SQL summary picks the
machines worth a look, ml.node_signals judges them, and the policy turns two flaps into one eviction."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from ml import node_signals
from ml.windows import floor_time
from service.config import get_settings
from service.diagnosis import metric_passes, service, signals, windows
from service.models import Decision, Finding, Job, Node, Rank, node_samples, node_windows
from service.ui.views.incident.page import incident_page

PORTS = ["ib:mlx5_0/1", "ib:mlx5_1/1"]


def _job(session: Session, nodes: int = 5) -> tuple[Job, dict[str, int]]:
    job = Job(external_id=f"net-{uuid.uuid4().hex[:8]}", source="registered", world_size=nodes * 8)
    job.hang_timeout_s = 600
    session.add(job)
    session.flush()
    ids = {}
    for n in range(nodes):
        node = Node(name=f"net-{job.id}-{n:03d}")
        session.add(node)
        session.flush()
        ids[node.name] = node.id
    session.add_all(Rank(job_id=job.id, rank=r, node_id=ids[name], local_rank=r % 8) for r, name in
                    enumerate(n for n in ids for _ in range(8)))  # fmt: skip
    session.flush()
    return job, ids


def _samples(job: Job, ids: dict[str, int], start: datetime, seconds: int, fault: Any) -> list[dict[str, Any]]:
    rng = random.Random(4)
    rows = []
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for t in range(0, seconds, 5):
        ts = start + timedelta(seconds=t)
        for name, node_id in ids.items():
            for subject in [*PORTS, "host"]:
                row: dict[str, Any] = {"ts": ts, "node_id": node_id, "job_id": job.id, "subject": subject}
                acc = totals.setdefault((name, subject), {})
                if subject == "host":
                    row.update(mem_total_mib=2e6, mem_available_mib=1.5e6, psi_mem_some_avg10=rng.uniform(0, 0.4))
                else:
                    row.update(port_state=4.0, port_rate_gbps=400.0)
                    acc["port_xmit_wait"] = acc.get("port_xmit_wait", 0.0) + 5 * 2000 * rng.uniform(0.8, 1.2)
                    acc.setdefault("link_downed", 3.0)
                fault(name, subject, t, row, acc)
                row.update(acc)
                rows.append(row)
    columns = {c for row in rows for c in row}
    return [dict.fromkeys(columns) | row for row in rows]  # an executemany needs every row to name every column


def test_two_flaps_in_counters_become_one_eviction(session: Session) -> None:
    job, ids = _job(session)
    bad = sorted(ids)[2]
    now = floor_time(datetime.now(UTC))
    start = now - timedelta(seconds=240)

    def flap(name: str, subject: str, t: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if name == bad and subject == PORTS[1] and t in (60, 150):
            row["port_state"] = 1.0
            acc["link_downed"] += 1

    session.execute(insert(node_samples), _samples(job, ids, start, 240, flap))
    session.flush()
    settings = get_settings()
    service.diagnose_job(session, job_id=job.external_id, settings=settings, now=now)
    assert session.scalar(select(func.count()).select_from(node_windows).where(node_windows.c.job_id == job.id)) > 0
    found = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "node_signals")).all()
    assert len(found) == 2 and {f.node_id for f in found} == {ids[bad]}
    assert all(f.category == "network" for f in found)
    evictions = session.scalars(select(Decision).where(Decision.kind == "evict", Decision.node_id == ids[bad])).all()
    assert len(evictions) == 1
    # Nobody else is accused.
    assert session.scalar(select(func.count()).select_from(Decision).where(Decision.node_id != ids[bad],
                          Decision.node_id.in_(ids.values()))) == 0  # fmt: skip


def test_the_sql_summary_matches_the_detectors_own(session: Session) -> None:
    """The pass's SQL aggregate reads the same machines and finds the same findings as ml on the whole frame."""
    job, ids = _job(session)
    names = sorted(ids)
    now = floor_time(datetime.now(UTC))
    start = now - timedelta(seconds=300)

    def faults(name: str, subject: str, t: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if name == names[1] and subject == PORTS[0] and t >= 100:
            acc["port_xmit_wait"] += 5 * 2000 * 100
            acc["pause_tx_frames"] = acc.get("pause_tx_frames", 0.0) + 5 * 800
        if name == names[3] and subject == "host" and t >= 200:
            row.update(psi_mem_some_avg10=40.0, psi_mem_full_avg10=12.0, mem_available_mib=4e4)
        if name == names[4] and subject == "host":
            acc["edac_ue"] = 0.0 if t < 250 else 1.0  # an uncorrected memory error

    session.execute(insert(node_samples), _samples(job, ids, start, 300, faults))
    session.flush()
    closed = windows.rollup_nodes(session, job=job, now=now, grace_s=6, lookback_s=300)
    info = signals.job_info(session, job=job)
    by_id = windows.node_names(session, node_ids=list(ids.values()))
    passed = metric_passes.node_findings(
        session, job=job, info=info, closed=closed, lookback_s=300, names=dict(by_id), now=now
    )
    whole = windows.read_nodes(
        session, job=job, start=closed - timedelta(seconds=300), end=closed, columns=sorted(windows.NODE_STORED),
        names=dict(by_id),
    )  # fmt: skip
    expected = node_signals.detect(info, whole, now=now)
    assert sorted((f.key, f.action) for f in passed) == sorted((f.key, f.action) for f in expected)
    assert {(f.node, f.evidence["rule"]) for f in passed} == {
        (names[1], "congestion"),
        (names[3], "memory_pressure"),
        (names[4], "memory_errors"),
    }
    assert isinstance(whole, pd.DataFrame)


def test_the_incident_page_plots_the_port_against_its_peers(session: Session) -> None:
    job, ids = _job(session)
    bad = sorted(ids)[1]
    now = floor_time(datetime.now(UTC))

    def congested(name: str, subject: str, t: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if name == bad and subject == PORTS[0] and t >= 60:
            acc["port_xmit_wait"] += 5 * 2000 * 100
            acc["pause_tx_frames"] = acc.get("pause_tx_frames", 0.0) + 5 * 800

    session.execute(insert(node_samples), _samples(job, ids, now - timedelta(seconds=300), 300, congested))
    session.flush()
    service.diagnose_job(session, job_id=job.external_id, settings=get_settings(), now=now)
    incident_id = session.scalar(
        select(Finding.incident_id).where(Finding.job_id == job.id, Finding.node_id == ids[bad])
    )
    assert incident_id is not None
    page = incident_page(session, incident_id=incident_id)
    plotted = {(c.subject, c.metric) for c in page.charts}
    assert (f"{bad} {PORTS[0]}", "port_xmit_wait") in plotted
    chart = next(c for c in page.charts if c.metric == "port_xmit_wait")
    last = chart.plot.windows[-1]
    assert last.median is not None and last.value > 50 * last.median  # the suspect's rate against its peers'
    assert page.incident.root_cause == "network"


def test_windows_are_built_on_one_pass_and_judged_on_the_next(session: Session) -> None:
    """Passes come every 5 s and windows every 10 s: in a large job the pass that builds a window's GPU rows is not
    the one that compares peers on them (windows.JUDGE_LAG_S); a small job's pass does both at once. The node windows
    (their samples come with the ship tick) are built and judged 1 s after their end, a pass before the GPU windows
    are built."""
    job, _ = _job(session, nodes=1)
    grace, node_grace = get_settings().window_grace_s, get_settings().node_window_grace_s
    assert (grace, node_grace) == (6, 1)
    large = get_settings().diagnosis_judge_lag_min_gpus
    assert windows.judge_lag_s(16384, min_gpus=large) == windows.JUDGE_LAG_S
    assert windows.judge_lag_s(8, min_gpus=large) == 0.0
    boundary = floor_time(datetime.now(UTC))
    for offset, built, nodes, judged in ((7, 0, 0, -10), (12, 0, 10, 0), (17, 10, 10, 0), (22, 10, 20, 10)):
        now = boundary + timedelta(seconds=offset)
        assert windows.rollup(session, job=job, now=now, grace_s=grace, lookback_s=300) == boundary + timedelta(
            seconds=built
        )
        assert windows.rollup_nodes(
            session, job=job, now=now, grace_s=node_grace, lookback_s=300
        ) == boundary + timedelta(seconds=nodes)
        assert windows.closed_at(now, grace_s=grace, lag_s=windows.JUDGE_LAG_S) == boundary + timedelta(seconds=judged)
        assert windows.closed_at(now, grace_s=grace, lag_s=0.0) == boundary + timedelta(seconds=built)
