"""Progress (ml.progress): hangs from step records or GPU activity, only while the job's processes live."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache

import pandas as pd
import pytest

from ml import progress
from ml.findings import Finding, JobInfo, LogRecord
from tests.simdata import SimRun
from tests.stored import check_evidence

TIMEOUT = 120.0


@cache
def sim(scenario: str, seed: int = 1, nodes: int = 2, gpus: int = 4) -> SimRun:
    return SimRun(scenario, seed=seed, nodes=nodes, gpus=gpus, hang_timeout_s=TIMEOUT).run(30 + TIMEOUT + 90)


def detect(run: SimRun, t: float, *, steps: bool = True, processes: bool = True) -> list[Finding]:
    """What a periodic run at simulated time t would see: recent signals, the last steps."""
    found = progress.detect(
        run.job,
        steps=run.steps(until=t, lookback=1800) if steps else [],
        processes=run.processes(until=t, lookback=300) if processes else None,
        metrics=run.metrics(until=t, lookback=TIMEOUT + 300),
        now=run.at(t),
    )
    check_evidence(found)
    return found


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hang_found_after_the_timeout_and_not_before(seed: int) -> None:
    run = sim("hang", seed)
    _, _, injected = run.fault()
    last_step = max(r.fields["step"] for r in run.steps(until=injected + 5))
    for t in range(40, int(injected + TIMEOUT) - 5, 10):
        assert detect(run, t) == [], t
    found = [detect(run, t) for t in range(int(injected + TIMEOUT) + 5, int(run.t) + 1, 10)]
    assert all(len(fs) == 1 for fs in found)
    f = found[0][0]
    assert f.detector == "progress" and f.category == "hang" and f.subject_kind == "job"
    assert f.subject == run.job.job_id and f.node is None
    assert f.action == "diagnose" and f.role == "cause" and f.confidence >= 0.85
    ev = f.evidence
    assert ev["last_step"] == last_step
    assert datetime.fromisoformat(ev["last_step_at"]) <= run.at(injected)
    assert ev["seconds_without_progress"] >= TIMEOUT
    assert ev["ranks_alive"] == run.job.world_size and ev["ranks_missing"] == []
    assert ev["signals"][0]["type"] == "log"
    assert {fs[0].key for fs in found} == {f.key}, "one hang, one key, however often it runs"


@pytest.mark.parametrize("scenario", ["ecc_dbe", "gpu_lost", "ib_flap", "user_bug"])
def test_no_hang_once_the_processes_are_gone(scenario: str) -> None:
    run = sim(scenario)
    for t in range(40, int(run.t) + 1, 10):
        assert detect(run, t) == [], t
        assert detect(run, t, processes=False) == [], t  # GPU memory released tells the same
        assert detect(run, t, steps=False) == [], t


@pytest.mark.parametrize("scenario", ["healthy", "straggler", "nvlink", "nan_loss"])
def test_progressing_jobs_are_not_hung(scenario: str) -> None:
    run = sim(scenario)
    for t in range(40, int(run.t) + 1, 20):
        assert detect(run, t) == []
        assert detect(run, t, steps=False) == []


def test_without_process_snapshots_gpu_memory_tells_the_job_lives() -> None:
    run = sim("hang")
    _, _, injected = run.fault()
    (f,) = detect(run, injected + TIMEOUT + 20, processes=False)
    assert f.evidence["gpus_holding_memory"] == run.job.world_size
    assert detect(run, injected + TIMEOUT - 20, processes=False) == []


def test_without_step_records_a_collapse_of_gpu_activity_is_a_hang() -> None:
    run = sim("hang")
    _, _, injected = run.fault()
    assert detect(run, injected + TIMEOUT - 10, steps=False) == []
    found = [detect(run, t, steps=False) for t in range(int(injected + TIMEOUT) + 10, int(run.t) + 1, 10)]
    assert all(len(fs) == 1 for fs in found)
    f = found[0][0]
    assert f.category == "hang" and f.confidence < 0.85
    assert f.evidence["metric"] == "tensor_active" and f.evidence["level_now"] < 0.01
    assert abs(datetime.fromisoformat(f.evidence["collapsed_since"]) - run.at(injected)) <= timedelta(seconds=10)
    assert len({fs[0].key for fs in found}) == 1


def test_a_young_job_without_steps_is_not_hung() -> None:
    run = sim("hang")
    _, _, injected = run.fault()
    t = injected + TIMEOUT + 30
    # The service only has samples since the job started, after the collapse: nothing to compare with.
    recent = run.metrics(until=t, lookback=TIMEOUT + 20)
    assert progress.detect(run.job, steps=[], processes=run.processes(until=t), metrics=recent, now=run.at(t)) == []


# --- hand-made records ---

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
JOB = JobInfo(job_id="j1", world_size=4, hang_timeout_s=600, rank_nodes={r: f"n{r // 2}" for r in range(4)})


def steps_between(first: int, start_s: float, end_s: float, every: float = 1.0, id0: int = 0) -> list[LogRecord]:
    """Rank 0 logs step first, first+1, ... every `every` s, from NOW-start_s to NOW-end_s."""
    out = []
    t, step = start_s, first
    while t >= end_s:
        ts = NOW - timedelta(seconds=t)
        out.append(LogRecord(id0 + len(out) + 1, ts, "n0", "step", f"step={step}", rank=0, fields={"step": step}))
        t -= every
        step += 1
    return out


def procs(start_s: float = 3600, end_s: float = -600, *, pid0: int = 100, state: str = "S") -> pd.DataFrame:
    """Snapshots of the 4 ranks every 5 s from NOW-start_s to NOW-end_s (later ones: runs at a later now)."""
    rows = []
    t = start_s
    while t >= end_s:
        for r in range(4):
            ts = NOW - timedelta(seconds=t)
            rows.append({"ts": ts, "node": f"n{r // 2}", "rank": r, "pid": pid0 + r, "cpu_pct": 99.0, "state": state})
        t -= 5
    return pd.DataFrame(rows)


def test_a_new_hang_later_is_a_new_finding() -> None:
    first = steps_between(100, 3000, 2500)  # hung at step 600 ...
    (a,) = progress.detect(JOB, steps=first, processes=procs(), metrics=None, now=NOW - timedelta(seconds=1800))
    # ... restarted from a checkpoint at step 550, trained to step 1050, hung again.
    second = first + steps_between(550, 1500, 1000, id0=10_000)
    (b,) = progress.detect(JOB, steps=second, processes=procs(), metrics=None, now=NOW)
    assert a.evidence["last_step"] == 600 and b.evidence["last_step"] == 1050
    assert a.key != b.key
    (b_again,) = progress.detect(JOB, steps=second, processes=procs(), metrics=None, now=NOW + timedelta(seconds=60))
    assert b_again.key == b.key


def test_zombies_or_stale_snapshots_are_not_alive() -> None:
    steps = steps_between(100, 2000, 1000)
    assert progress.detect(JOB, steps=steps, processes=procs(state="Z"), metrics=None, now=NOW) == []
    assert progress.detect(JOB, steps=steps, processes=procs(end_s=120), metrics=None, now=NOW) == []
    # Half the ranks gone is still a job holding its GPUs; three quarters gone is a crash.
    half = procs()
    half = half[(half["rank"] < 2) | (half["ts"] < NOW - timedelta(seconds=300))]
    (f,) = progress.detect(JOB, steps=steps, processes=half, metrics=None, now=NOW)
    assert f.evidence["ranks_alive"] == 2 and f.evidence["ranks_missing"] == [2, 3]
    quarter = half[(half["rank"] < 1) | (half["ts"] < NOW - timedelta(seconds=300))]
    assert progress.detect(JOB, steps=steps, processes=quarter, metrics=None, now=NOW) == []


def test_nothing_tells_whether_the_job_lives() -> None:
    assert progress.detect(JOB, steps=steps_between(100, 2000, 1000), processes=None, metrics=None, now=NOW) == []


def test_a_restart_gets_its_own_time_to_log_a_first_step() -> None:
    steps = steps_between(100, 3000, 2000)
    restarted = pd.concat([procs(3600, 400, pid0=100), procs(300, pid0=900)])
    assert progress.detect(JOB, steps=steps, processes=restarted, metrics=None, now=NOW) == []
    (f,) = progress.detect(JOB, steps=steps, processes=restarted, metrics=None, now=NOW + timedelta(seconds=400))
    assert f.evidence["restarted_at"] == (NOW - timedelta(seconds=300)).isoformat()


def test_a_job_that_logs_rarely_gets_a_longer_timeout() -> None:
    rare = steps_between(100, 4700, 800, every=300)  # a line every 5 minutes; the last 800 s ago
    assert progress.detect(JOB, steps=rare, processes=procs(6000), metrics=None, now=NOW) == []
    (f,) = progress.detect(JOB, steps=rare, processes=procs(6000), metrics=None, now=NOW + timedelta(seconds=200))
    assert f.evidence["timeout_s"] == 900


def test_odd_input_is_skipped() -> None:
    junk = [
        LogRecord(1, NOW - timedelta(hours=2), "n0", "step", "x", rank=0, fields={"step": "nine"}),
        LogRecord(2, NOW - timedelta(hours=2), "n0", "step", "x", rank=0, fields={"step": True}),
        LogRecord(3, NOW - timedelta(hours=2), "n0", "step", "x", rank=0, fields={"step": float("nan")}),
    ]
    odd = pd.DataFrame({"ts": ["soon", None], "rank": ["a", 1]})
    assert progress.detect(JOB, steps=junk, processes=odd, metrics=pd.DataFrame({"x": [1]}), now=NOW) == []
    good = steps_between(100, 2000, 1000)
    naive = NOW.replace(tzinfo=None)
    (f,) = progress.detect(JOB, steps=junk + good, processes=procs().drop(columns=["state"]), metrics=None, now=naive)
    assert f.evidence["last_step"] == 1100


def test_processes_that_appear_after_a_wait_longer_than_the_window_are_a_restart() -> None:
    """The campaign: a drained machine's job waited 2 min for a spare, then restarted; the service reads the last
    60 s of snapshots, which held only the new processes. Judged hung from the last step before the wait, its
    stacks (a new rank still reading its first batch) accused the spare's healthy machine."""
    steps = steps_between(100, 3000, 200)  # the last step 200 s before NOW
    later = NOW + timedelta(seconds=500)  # 700 s without a step: past the 600 s timeout
    since = later - timedelta(seconds=60)
    new = procs(-493, -600, pid0=900)  # new pids, first reported 7 s before `later`
    restarted = progress.detect(JOB, steps=steps, processes=new, metrics=None, now=later, processes_since=since)
    assert restarted == []
    # Not knowing where the snapshots begin, the same processes look like the stalled job's: the old answer.
    (hung,) = progress.detect(JOB, steps=steps, processes=new, metrics=None, now=later)
    assert hung.evidence.get("restarted_at") is None
    # Processes reported from the window's start are the stalled job's own: still hung.
    steady = procs(3600, -600, pid0=100)
    steady = steady[steady["ts"] >= since]
    (f,) = progress.detect(JOB, steps=steps, processes=steady, metrics=None, now=later, processes_since=since)
    assert f.evidence.get("restarted_at") is None


def test_processes_that_appear_24_s_into_a_window_of_10_s_snapshots_are_a_restart() -> None:
    """The 200-fault campaign's one incident of unknown blame: the job waited 95 s for a spare and restarted; the
    pass read 60 s of snapshots taken every 10 s, the new processes first 24 s into them (under FRESH_S): judged
    hung from its last step before the wait, 198 s earlier."""
    steps = steps_between(100, 3000, 200)
    later = NOW + timedelta(seconds=500)
    since = later - timedelta(seconds=60)
    every_10_s = lambda frame: frame[frame["ts"].map(lambda ts: (ts - since).total_seconds() % 10 == 4)]  # noqa: E731
    new = every_10_s(procs(-464, -600, pid0=900))  # new pids, from 24 s into the window
    assert progress.detect(JOB, steps=steps, processes=new, metrics=None, now=later, processes_since=since) == []
    # The stalled job's own processes, sampled every 10 s from the window's start: still hung.
    steady = every_10_s(procs(-444, -600, pid0=100))  # from 4 s into the window
    (f,) = progress.detect(JOB, steps=steps, processes=steady, metrics=None, now=later, processes_since=since)
    assert f.evidence.get("restarted_at") is None
