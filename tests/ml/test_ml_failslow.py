"""Fail-slow (ml.failslow): per-rank step times, job slowdowns and process CPU, each over repeated rounds."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache

import pandas as pd
import pytest

from ml import failslow
from ml.findings import Finding, JobInfo, LogRecord
from tests.simdata import SimRun
from tests.stored import check_evidence

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RANKS = 8


@cache
def sim(scenario: str, seed: int, nodes: int = 2, gpus: int = 4) -> SimRun:
    return SimRun(scenario, seed=seed, nodes=nodes, gpus=gpus).run(240)


def run_detector(run: SimRun, t: float) -> list[Finding]:
    found = failslow.detect(
        run.job, steps=run.steps(until=t, lookback=900), processes=run.processes(until=t, lookback=300), now=run.at(t)
    )
    check_evidence(found)
    return found


def node_of(rank: int) -> str:
    return f"n{rank // 4}"


JOB = JobInfo(job_id="j1", world_size=RANKS, rank_nodes={r: node_of(r) for r in range(RANKS)})


def rank_steps(
    seconds: int = 120, *, slow: dict[int, float] | None = None, slow_after: float = 0.0, seed: int = 0
) -> list[LogRecord]:
    """Every rank logs its own step time each second; ranks in `slow` take that factor longer."""
    rng = random.Random(seed)
    out = []
    for i in range(seconds):
        ts = NOW - timedelta(seconds=seconds - i)
        for r in range(RANKS):
            factor = (slow or {}).get(r, 1.0) if i >= slow_after else 1.0
            ms = 800.0 * factor * (1 + rng.gauss(0, 0.02))
            out.append(
                LogRecord(
                    id=len(out) + 1,
                    ts=ts,
                    node=node_of(r),
                    kind="step",
                    line=f"rank={r} step={1000 + i} elapsed_ms={ms:.1f}",
                    rank=r,
                    fields={"step": 1000 + i, "elapsed_ms": ms},
                )
            )
    return out


# --- (a) per-rank step times ---


def test_a_rank_slower_in_every_round_is_a_straggler_on_its_node() -> None:
    (f,) = failslow.detect(JOB, steps=rank_steps(slow={5: 1.25}), processes=None, now=NOW)
    check_evidence([f])
    assert f.detector == "failslow" and f.category == "straggler"
    assert f.subject_kind == "rank" and f.subject == "rank 5" and f.node == "n1"
    assert f.action == "evict" and f.blame == "infrastructure" and f.role == "cause"
    assert len(f.evidence["rounds"]) == 5
    assert all(
        1.15 < r["ratio"] < 1.35 and r["peer_p10"] <= r["peer_median"] <= r["peer_p90"] for r in f.evidence["rounds"]
    )
    assert f.evidence["signals"] and all(s["type"] == "log" for s in f.evidence["signals"])
    # Re-running later on the same evidence names the same claim: the same series.
    (again,) = failslow.detect(JOB, steps=rank_steps(slow={5: 1.25}), processes=None, now=NOW + timedelta(seconds=1))
    assert again.series == f.series == "rank_step_time:5:n1"


def test_a_rank_that_recovered_in_the_last_round_is_no_straggler() -> None:
    steps = rank_steps(slow={5: 1.25})
    recent = [s for s in steps if s.ts >= NOW - timedelta(seconds=10)]
    healed = [
        LogRecord(s.id, s.ts, s.node, s.kind, s.line, rank=s.rank, fields={**s.fields, "elapsed_ms": 800.0})
        if s in recent
        else s
        for s in steps
    ]
    assert failslow.detect(JOB, steps=healed, processes=None, now=NOW) == []


def test_synchronous_ranks_or_small_differences_are_not_stragglers() -> None:
    assert failslow.detect(JOB, steps=rank_steps(), processes=None, now=NOW) == []
    assert failslow.detect(JOB, steps=rank_steps(slow={5: 1.06}), processes=None, now=NOW) == []
    # Half the job slow: a split, not one bad rank (and no baseline shift: every round looks alike).
    half = rank_steps(slow=dict.fromkeys(range(4), 1.3))
    assert failslow.detect(JOB, steps=half, processes=None, now=NOW) == []


def test_pipeline_stages_are_compared_among_themselves() -> None:
    job = JobInfo(job_id="pp", world_size=RANKS, pp=2, dp=4, rank_nodes={r: node_of(r) for r in range(RANKS)})
    last_stage_heavier = dict.fromkeys(range(4, 8), 1.3)
    assert failslow.detect(job, steps=rank_steps(slow=last_stage_heavier), processes=None, now=NOW) == []
    (f,) = failslow.detect(job, steps=rank_steps(slow={**last_stage_heavier, 2: 1.25}), processes=None, now=NOW)
    assert f.subject == "rank 2" and all(r["n_peers"] == 3 for r in f.evidence["rounds"])


# --- (b) job-level slowdown ---


def test_a_job_slower_than_its_own_pace_in_every_round_is_a_job_finding() -> None:
    steps = rank_steps(180, slow=dict.fromkeys(range(RANKS), 1.5), slow_after=100)
    found = failslow.detect(JOB, steps=steps, processes=None, now=NOW)
    check_evidence(found)
    (f,) = [f for f in found if f.subject_kind == "job"]
    assert f.subject == "j1" and f.node is None and f.category == "straggler"
    assert f.action == "diagnose" and f.role == "cause"
    assert f.evidence["source"] == "elapsed_ms"
    assert f.evidence["onset_step"] == 1100
    assert 1.4 < f.evidence["ratio"] < 1.6
    assert all(r["ratio"] >= 1.3 for r in f.evidence["rounds"])
    later = failslow.detect(JOB, steps=steps, processes=None, now=NOW - timedelta(seconds=7))
    assert [x.key for x in later if x.subject_kind == "job"] == [f.key]


def test_whole_second_stamps_still_measure_the_pace() -> None:
    # One stream, stamps without fractions (Megatron's), no logged step time: 1.0 s steps, then 1.35 s.
    out, t, step = [], 0.0, 5000
    while t < 300:
        ts = NOW - timedelta(seconds=300) + timedelta(seconds=int(t))
        out.append(LogRecord(len(out) + 1, ts, "n1", "step", f"iteration {step}", fields={"step": step}))
        t += 1.0 if step < 5150 else 1.35
        step += 1
    keys = set()
    for lag in range(0, 60, 10):
        now = NOW - timedelta(seconds=lag)
        found = failslow.detect(JOB, steps=[r for r in out if r.ts < now], processes=None, now=now)
        (f,) = found
        assert f.evidence["source"] == "step_timestamps"
        assert abs(f.evidence["onset_step"] - 5150) <= 5
        keys.add(f.key)
    assert len(keys) == 1


def test_no_slowdown_without_an_earlier_baseline_or_below_the_ratio() -> None:
    young = rank_steps(40, slow=dict.fromkeys(range(RANKS), 1.5), slow_after=0)
    assert failslow.detect(JOB, steps=young, processes=None, now=NOW) == []
    mild = rank_steps(180, slow=dict.fromkeys(range(RANKS), 1.2), slow_after=100)
    assert failslow.detect(JOB, steps=mild, processes=None, now=NOW) == []


@pytest.mark.parametrize(("seed", "nodes"), [(1, 2), (2, 4), (3, 4), (4, 2)])
def test_sim_straggler_slows_the_job_and_healthy_runs_do_not(seed: int, nodes: int) -> None:
    run = sim("straggler", seed, nodes)
    _, _, injected = run.fault()
    assert [f for t in range(60, int(injected) + 1, 10) for f in run_detector(run, t)] == []
    found = {}
    for t in range(int(injected) + 10, int(injected) + 121, 10):
        for f in run_detector(run, t):
            found.setdefault(f.key, (t, f))
    assert len(found) == 1, "one slowdown episode, one key"
    ((t, f),) = found.values()
    assert f.subject_kind == "job" and f.category == "straggler"
    assert t - injected <= 90
    assert abs(f.observed_at - run.at(injected)) < timedelta(seconds=3)
    healthy = sim("healthy", seed, nodes)
    assert [f for t in range(60, 241, 10) for f in run_detector(healthy, t)] == []


def test_a_stopped_job_is_not_slow() -> None:
    run = sim("hang", 1)
    _, _, injected = run.fault()
    for t in range(int(injected) + 10, 241, 10):
        assert [f for f in run_detector(run, t) if f.subject_kind == "job"] == []


# --- (c) process CPU ---


def cpu_frame(
    cpu: dict[int, float], *, seconds: int = 60, every: float = 5.0, default: float = 6.0, off_round: int | None = None
) -> pd.DataFrame:
    """Snapshots of every rank; ranks in `cpu` run at that CPU, the others idle-wait, except in the
    ten-second round `off_round` (0 = the latest), where everyone looks alike."""
    rng = random.Random(1)
    rows = []
    for i in range(int(seconds / every)):
        ts = NOW - timedelta(seconds=seconds - i * every)
        age = (NOW - ts).total_seconds()
        off = off_round is not None and off_round * 10 < age <= (off_round + 1) * 10
        for r in range(RANKS):
            value = default if off else cpu.get(r, default)
            rows.append(
                {
                    "ts": ts,
                    "node": node_of(r),
                    "rank": r,
                    "pid": 100 + r,
                    "cpu_pct": value + rng.gauss(0, 1.5),
                    "state": "S",
                }
            )
    return pd.DataFrame(rows)


def test_a_rank_busy_while_its_peers_wait_is_a_weak_suspect() -> None:
    (f,) = failslow.detect(JOB, steps=[], processes=cpu_frame({6: 100.0}), now=NOW)
    check_evidence([f])
    assert f.subject == "rank 6" and f.node == "n1" and f.category == "straggler"
    assert f.action == "diagnose" and f.confidence <= 0.5
    assert f.evidence["direction"] == "high" and len(f.evidence["rounds"]) == 5
    assert all(r["rank_cpu_pct"] > 90 and r["peer_median"] < 15 for r in f.evidence["rounds"])


def test_rank_zero_and_logging_ranks_may_work_harder() -> None:
    assert failslow.detect(JOB, steps=[], processes=cpu_frame({0: 100.0}), now=NOW) == []
    # An idle rank 0 among busy peers is still an outlier.
    (f,) = failslow.detect(JOB, steps=[], processes=cpu_frame({0: 2.0}, default=97.0), now=NOW)
    assert f.subject == "rank 0" and f.evidence["direction"] == "low"


def test_cpu_outlier_must_hold_in_every_round() -> None:
    assert failslow.detect(JOB, steps=[], processes=cpu_frame({6: 100.0}, off_round=2), now=NOW) == []
    assert failslow.detect(JOB, steps=[], processes=cpu_frame({6: 14.0}), now=NOW) == [], "within the floor"
    dead = cpu_frame({6: 100.0})
    dead.loc[dead["rank"] == 6, "state"] = "Z"
    assert failslow.detect(JOB, steps=[], processes=dead, now=NOW) == []


def test_sparse_snapshots_stretch_the_rounds() -> None:
    (f,) = failslow.detect(JOB, steps=[], processes=cpu_frame({6: 100.0}, seconds=300, every=15.0), now=NOW)
    assert f.subject == "rank 6"
    first, last = f.evidence["rounds"][0], f.evidence["rounds"][-1]
    assert datetime.fromisoformat(first["end"]) - datetime.fromisoformat(last["start"]) == timedelta(seconds=150)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sim_hang_names_the_idle_culprit_rank(seed: int) -> None:
    run = sim("hang", seed)
    node, _, injected = run.fault()
    culprit = run.cluster.faults[0].ranks[0]
    found = [f for t in range(int(injected) + 10, 241, 10) for f in run_detector(run, t)]
    assert found and {f.subject for f in found} == {f"rank {culprit}"}
    assert {(f.category, f.node, f.series) for f in found} == {("hang", node, f"cpu:{culprit}:{node}:low:hang")}


def test_odd_input_is_skipped() -> None:
    junk = [
        LogRecord(1, NOW, "n0", "step", "x", rank=0, fields={"step": "many"}),
        LogRecord(2, NOW, "n0", "step", "x", rank=None, fields={"step": 1.5, "elapsed_ms": "fast"}),
        LogRecord(3, NOW, "n0", "xid", "x", rank=1, fields={}),
    ]
    assert failslow.detect(JOB, steps=junk, processes=pd.DataFrame({"ts": ["?"]}), now=NOW) == []
    frame = cpu_frame({6: 100.0}).drop(columns=["state"])
    frame["cpu_pct"] = frame["cpu_pct"].astype(object)
    frame.loc[frame.index[::9], "cpu_pct"] = None
    assert [f.subject for f in failslow.detect(JOB, steps=junk, processes=frame, now=NOW)] == ["rank 6"]
    assert failslow.detect(JOB, steps=rank_steps(slow={5: 1.3}), processes=None, now=NOW, rounds=0) == []


def test_the_same_rank_slow_again_hours_later_is_a_new_episode_of_its_series() -> None:
    """A weeks-long job: rank 5 lags, its machine is dealt with, and hours later it lags again. A key without the
    episode's time made the second finding the first one's, already stored: nothing new, nobody told."""
    (first,) = failslow.detect(JOB, steps=rank_steps(slow={5: 1.25}), processes=None, now=NOW)
    later = [replace(r, ts=r.ts + timedelta(hours=2)) for r in rank_steps(slow={5: 1.25})]
    (again,) = failslow.detect(JOB, steps=later, processes=None, now=NOW + timedelta(hours=2))
    assert again.key != first.key and again.series == first.series
