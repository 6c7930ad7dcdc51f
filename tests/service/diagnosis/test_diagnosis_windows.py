"""Windowed metrics in diagnosis: windows built once in SQL, detector state kept between passes, and the
straggler found from windows as the peers detector finds it from raw samples."""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import cache

import pandas as pd
from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from ml import peers, recurrence
from ml.metrics import METRIC_COLUMNS, WINDOW_S
from ml.windows import floor_time, from_samples
from service.config import get_settings
from service.diagnosis import metric_passes, service, state, windows
from service.models import DetectorState, Finding, Job, Node, Rank, job_columns, metric_samples, metric_windows
from tests.simdata import SimRun


@cache
def _straggler() -> SimRun:
    return SimRun("straggler", seed=2, nodes=4, gpus=8).run(260)


@cache
def _healthy() -> SimRun:
    return SimRun("healthy", seed=3, nodes=4, gpus=8).run(240)


def _load(session: Session, run: SimRun, frame: pd.DataFrame | None = None) -> Job:
    """The simulated job, its nodes and ranks, and every metric sample it recorded."""
    info = run.job
    job = Job(
        external_id=f"{info.job_id}-{uuid.uuid4().hex[:6]}", source="registered", world_size=info.world_size, dp=info.dp
    )
    job.hang_timeout_s = 600
    session.add(job)
    session.flush()
    ids = {}
    for name in sorted(set(info.rank_nodes.values())):
        node = Node(name=f"{name}-{job.id}")
        session.add(node)
        session.flush()
        ids[name] = node.id
    session.add_all(
        Rank(job_id=job.id, rank=r, node_id=ids[n], local_rank=r % run.gpus) for r, n in info.rank_nodes.items()
    )
    frame = run.metrics() if frame is None else frame
    columns = [c for c in METRIC_COLUMNS if c in frame.columns]
    rows = [
        {"ts": r["ts"], "node_id": ids[r["node"]], "gpu": int(r["gpu"]), "job_id": job.id, **{c: r[c] for c in columns}}
        for r in frame.to_dict("records")
    ]
    session.execute(insert(metric_samples), rows)
    session.flush()
    return job


def _count(session: Session, job: Job) -> int:
    return session.scalar(select(func.count()).select_from(metric_windows).where(metric_windows.c.job_id == job.id))


def test_windows_are_built_once_with_means_and_maxima(session: Session) -> None:
    run = _straggler()
    job = _load(session, run)
    now = run.at(120)
    closed = windows.rollup(session, job=job, now=now, grace_s=6, lookback_s=300)
    assert closed == floor_time(now - timedelta(seconds=6))
    stored = _count(session, job)
    expected = from_samples(run.metrics(until=120))
    expected = expected[pd.to_datetime(expected["window_start"], utc=True) < pd.Timestamp(closed)]
    assert stored == len(expected) > 0
    # The same means and maxima as ml.windows computes from the raw samples.
    row = session.execute(
        select(metric_windows).where(metric_windows.c.job_id == job.id).order_by(metric_windows.c.window_start)
    ).first()
    assert row is not None
    first = expected.sort_values("window_start").iloc[0]
    assert row.n == first["n"]
    assert abs(row.power_usage - first["power_usage"]) < 1e-3
    assert row.total_energy_max == first["total_energy_max"]
    # Again at the same time: nothing new; later: only the windows that closed since.
    windows.rollup(session, job=job, now=now, grace_s=6, lookback_s=300)
    assert session.scalar(
        select(func.count()).select_from(metric_windows).where(metric_windows.c.job_id == job.id)
    ) == (stored)
    windows.rollup(session, job=job, now=now + timedelta(seconds=20), grace_s=6, lookback_s=300)
    assert _count(session, job) == stored + 2 * 32  # two more windows of 32 GPUs
    cursor, _ = state.load(session, job_id=job.id, detector=windows.DETECTOR, version=windows.VERSION)
    assert cursor == floor_time(now + timedelta(seconds=14))


def test_passes_every_five_seconds_find_the_straggler_as_the_raw_detector_does(session: Session) -> None:
    run = _straggler()
    node, gpu, injected = run.fault()
    job = _load(session, run)
    settings = get_settings()
    found_at = None
    t = injected
    while t <= injected + 200 and found_at is None:
        service.diagnose_job(session, job_id=job.external_id, settings=settings, now=run.at(t))
        rows = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "peers")).all()
        if rows:
            found_at = t
            assert {r.subject for r in rows} == {f"{node}-{job.id}/{gpu}"}
        t += 5
    assert found_at is not None and found_at - injected <= 180
    # The raw-sample detector at the same moment names the same GPU.
    raw = peers.detect(run.job, run.metrics(until=found_at, lookback=300), now=run.at(found_at - 6))
    assert {f.subject for f in raw} == {f"{node}/{gpu}"}
    # The peers state holds one span per window boundary over the recurrence horizon, sparse: only the GPUs far
    # from their peers, and beyond the continuity history only the outliers.
    _, kept = state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION)
    spans = kept["spans"]
    assert 8 <= len(spans) <= recurrence.HORIZON_S / WINDOW_S
    latest = spans[max(spans)]
    assert all(len(m["z"]) <= 8 for m in latest["metrics"].values())

    # Beyond the continuity history a span keeps only what the recurrence reads: its outliers.
    out = {"n/1": {"z": -6.0, "score": 6.0}}
    span = {
        "active": True,
        "steady": False,
        "metrics": {
            "power_usage": {"z": {"n/1": -6.0, "n/2": 2.5}, "out": out},
            "sm_clock": {"z": {"n/3": 2.1}, "out": {}},
        },
    }
    kept = {"active": True, "steady": False, "metrics": {"power_usage": {"out": out}}}
    assert metric_passes._outliers_only(span) == kept


def test_state_of_another_version_is_ignored(session: Session) -> None:
    run = _straggler()
    job = _load(session, run)
    settings = get_settings()
    now = run.at(200)
    service.diagnose_job(session, job_id=job.external_id, settings=settings, now=now)
    assert state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION)[1]["spans"]
    session.execute(
        update(DetectorState)
        .where(DetectorState.job_id == job.id, DetectorState.detector == "peers")
        .values(version=metric_passes.PEERS_VERSION + 1, state={"spans": {"garbage": {}}})
    )
    assert state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION) == (None, {})
    # The next pass starts afresh (a cold start summarizes the history) instead of reading what it cannot.
    result = service.diagnose_job(session, job_id=job.external_id, settings=settings, now=now + timedelta(seconds=5))
    assert "peers" in result.timings
    _, kept = state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION)
    assert "garbage" not in kept["spans"] and len(kept["spans"]) >= 8


def test_a_detector_that_fails_does_not_abort_the_pass(session: Session, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = _straggler()
    job = _load(session, run)

    def broken(*args: object, **kwargs: object) -> list[object]:
        session.execute(select(func.not_a_function()))  # a failing query inside the pass's transaction
        return []

    monkeypatch.setattr(metric_passes, "counter_findings", broken)
    now = run.at(250)
    result = service.diagnose_job(session, job_id=job.external_id, settings=get_settings(), now=now)
    assert "counters" in result.timings and "peers" in result.timings
    # The transaction is still usable after the failed detector: peers ran and its state was saved.
    assert state.load(session, job_id=job.id, detector="peers", version=metric_passes.PEERS_VERSION)[0] is not None


def test_counters_find_a_rising_uncorrectable_counter_and_a_lost_gpu_from_three_windows(session: Session) -> None:
    run = _healthy()
    frame = run.metrics().copy()
    ts = pd.to_datetime(frame["ts"], utc=True)
    broken = (frame["node"] == "node-001") & (frame["gpu"] == 2)
    frame.loc[broken, "ecc_dbe_volatile"] = (ts[broken] >= pd.Timestamp(run.at(150))).astype(float) * 2
    lost = (frame["node"] == "node-002") & (frame["gpu"] == 5) & (ts > pd.Timestamp(run.at(170)))
    job = _load(session, run, frame[~lost])
    service.diagnose_job(session, job_id=job.external_id, settings=get_settings(), now=run.at(230))
    found = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "counters")).all()
    by_subject = {f.subject: f for f in found}
    assert set(by_subject) == {f"node-001-{job.id}/2", f"node-002-{job.id}/5"}
    assert by_subject[f"node-001-{job.id}/2"].evidence["counters"] == {"ecc_dbe_volatile": 2}
    assert by_subject[f"node-002-{job.id}/5"].summary.startswith("GPU 5 on")
    # The healthy job alone: no counter finding.
    calm = _load(session, run)
    service.diagnose_job(session, job_id=calm.external_id, settings=get_settings(), now=run.at(230))
    assert not session.scalars(select(Finding).where(Finding.job_id == calm.id, Finding.detector == "counters")).all()


def test_only_a_big_jobs_step_lines_and_snapshots_are_thinned() -> None:
    """A small job is read at full resolution, which fail-slow's rounds need (a 4x slower rank in an 8-rank
    torchrun job was missed at 10 s buckets); a big one is thinned so a pass reads a bounded number of rows."""
    from service.diagnosis.signals import STEP_BUCKET_S, thinning_s
    from service.models import Job

    assert thinning_s(Job(world_size=8), 300) == 0
    assert thinning_s(Job(world_size=None), 300) == 0
    assert thinning_s(Job(world_size=16_384), 300) == STEP_BUCKET_S


def test_windows_roll_up_only_the_columns_the_jobs_agents_reported(session: Session) -> None:
    run = _straggler()
    job = _load(session, run)
    # Ingest recorded sm_clock and power_usage (and a counter), not gpu_temp, though the rows hold it.
    reported = ["sm_clock", "power_usage", "total_energy"]
    session.execute(insert(job_columns), [{"job_id": job.id, "source": "gpu", "name": c} for c in reported])
    assert windows.reported_columns(session, job_id=job.id, source="gpu") == frozenset(reported)
    windows.rollup(session, job=job, now=run.at(120), grace_s=6, lookback_s=300)
    rows = session.execute(select(metric_windows).where(metric_windows.c.job_id == job.id)).mappings().all()
    assert rows
    assert all(r["sm_clock"] is not None and r["power_usage"] is not None for r in rows)
    assert all(r["total_energy_max"] is not None for r in rows)
    assert all(r["gpu_temp"] is None for r in rows)  # not reported: not aggregated
    assert all(r["n"] > 0 for r in rows)


def test_a_job_with_no_reported_columns_rolls_up_every_column(session: Session) -> None:
    run = _straggler()
    job = _load(session, run)  # rows written directly, as a benchmark or an import would: nothing recorded
    windows.rollup(session, job=job, now=run.at(120), grace_s=6, lookback_s=300)
    rows = session.execute(select(metric_windows).where(metric_windows.c.job_id == job.id)).mappings().all()
    assert rows and all(r["gpu_temp"] is not None and r["sm_clock"] is not None for r in rows)
