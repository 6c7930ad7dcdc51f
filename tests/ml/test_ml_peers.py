"""Peer comparison (ml.peers): simulated clusters healthy and faulty, then hand-made frames for the edges."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from functools import cache

import pandas as pd
import pytest

from ml import peers
from ml.findings import ACTIONS, BLAMES, CATEGORIES, Finding, JobInfo
from tests.simdata import SimRun
from tests.stored import check_evidence

EVERY = 10  # seconds between two detector runs, as a periodic task would
END = 300.0


@cache
def _sim(scenario: str, seed: int, nodes: int, gpus: int, end: float) -> SimRun:
    return SimRun(scenario, seed=seed, nodes=nodes, gpus=gpus).run(end)


def sim(scenario: str, seed: int, nodes: int = 4, gpus: int = 8, end: float = END) -> SimRun:
    return _sim(scenario, seed, nodes, gpus, end)


def runs(run: SimRun, start: float = 60.0, end: float = END) -> list[tuple[float, list[Finding]]]:
    """The detector every EVERY seconds, each time on the last five minutes of samples."""
    out = []
    t = start
    while t <= end + 1e-9:
        out.append((t, peers.detect(run.job, run.metrics(until=t, lookback=300), now=run.at(t))))
        t += EVERY
    return out


def check_contract(f: Finding) -> None:
    assert f.detector == "peers"
    assert f.category in CATEGORIES and f.blame in BLAMES and f.action in ACTIONS
    assert 0 < f.confidence <= 1
    assert f.subject_kind == "gpu" and f.node is not None and f.subject.startswith(f.node + "/")
    assert f.key and f.observed_at.tzinfo is not None
    check_evidence([f])


@pytest.mark.parametrize(
    ("seed", "nodes", "gpus"), [(1, 4, 8), (2, 4, 8), (3, 2, 8), (4, 2, 2), (5, 1, 3), (6, 3, 4), (7, 8, 8)]
)
def test_healthy_clusters_have_no_findings_at_all(seed: int, nodes: int, gpus: int) -> None:
    found = [(t, f.subject, f.summary) for t, fs in runs(sim("healthy", seed, nodes, gpus)) for f in fs]
    assert found == []


@pytest.mark.parametrize(("seed", "nodes", "gpus"), [(1, 4, 8), (2, 4, 8), (3, 4, 8), (4, 2, 2), (5, 3, 4)])
def test_straggler_found_on_the_right_gpu_within_three_minutes(seed: int, nodes: int, gpus: int) -> None:
    run = sim("straggler", seed, nodes, gpus)
    node, gpu, injected = run.fault()
    history = runs(run, start=injected, end=injected + 180)
    hits = [(t, f) for t, fs in history for f in fs]
    assert hits, "the straggler must be found within 3 minutes"
    assert {f.subject for _, f in hits} == {f"{node}/{gpu}"}, "and nothing else, ever"
    t_first, first = hits[0]
    assert t_first - injected <= 180
    assert [f for _, fs in history[: history.index((t_first, [first]))] for f in fs] == []
    check_contract(first)
    assert first.category == "straggler" and first.node == node
    assert first.action == "evict" and first.blame == "infrastructure" and first.role == "cause"
    assert first.confidence >= 0.5
    # Dated when the GPU first stood apart (the end of its first flagged span), never before the fault: the span's
    # start, which precedes the fault by up to a span, was the date before.
    assert run.at(injected) <= first.observed_at <= run.at(injected + 30)
    # The evidence a UI plots: per window, the suspect against the peers' median and p10-p90 band.
    lead = first.evidence["metrics"][0]
    assert lead["metric"] in peers.DEFAULT_PRIORITY
    # Named by the change point (issue 44: within a minute): its back-to-back spans are shown, not the continuity's 4.
    assert first.evidence["rule"] == "changepoint" and t_first - injected <= 60
    assert len(lead["windows"]) >= 1
    for w in lead["windows"]:
        assert {"start", "end", "value", "peer_median", "peer_p10", "peer_p90", "score", "z"} <= set(w)
        assert w["peer_p10"] <= w["peer_median"] <= w["peer_p90"]
        assert not w["peer_p10"] <= w["value"] <= w["peer_p90"]
        assert abs(w["z"]) >= peers.Z_MIN
    assert {s["type"] for s in first.evidence["signals"]} == {"metric"}
    # Re-runs name the same claim: one series, whose key moves with the onset once the episode outgrows the
    # history a pass reads (the service moves the series' one row).
    assert {f.series for _, f in hits} == {first.series} == {f"{node}/{gpu}:straggler"}


def test_straggler_evidence_grows_to_the_telling_metrics() -> None:
    run = sim("straggler", 1)
    node, gpu, _ = run.fault()
    (late,) = peers.detect(run.job, run.metrics(until=END, lookback=300), now=run.at(END))
    assert late.subject == f"{node}/{gpu}"
    metrics = {m["metric"]: m for m in late.evidence["metrics"]}
    # A throttled GPU: low clock, low power, hot; busier than its peers, which wait for it.
    assert metrics["sm_clock"]["direction"] == "low"
    assert metrics["power_usage"]["direction"] == "low"
    assert metrics["gpu_temp"]["direction"] == "high"
    assert metrics["tensor_active"]["direction"] == "high"
    assert late.confidence >= 0.9
    # The headline and the first plot: the clock that says why it lags (1,350 vs 1,980 MHz), then its heat and power;
    # the busy counters, which stand out more but only say it works longer each step, after them in priority order.
    assert list(metrics)[:3] == ["sm_clock", "gpu_temp", "power_usage"]
    assert "low sm_clock" in late.summary.split("metrics:")[0]
    rest = [peers.DEFAULT_PRIORITY.index(m) for m in list(metrics)[3:]]
    assert rest == sorted(rest), "the others in priority order"


def test_the_metric_that_explains_the_lag_leads_and_an_idle_gpu_leads_with_its_activity() -> None:
    def m(metric: str, direction: str) -> dict:
        return {"metric": metric, "direction": direction, "score": 9.0, "windows": []}

    slow = [m("tensor_active", "high"), m("sm_active", "high"), m("sm_clock", "low"), m("power_usage", "low")]
    assert [x["metric"] for x in peers.most_telling_first(slow, idle=False)] == [
        "sm_clock", "power_usage", "tensor_active", "sm_active",
    ]  # fmt: skip
    # Waiting for its input: its clock and power drop as any idle GPU's do, so the low activity tells.
    idle = [m("power_usage", "low"), m("sm_clock", "low"), m("tensor_active", "low")]
    assert [x["metric"] for x in peers.most_telling_first(idle, idle=True)] == [
        "tensor_active", "power_usage", "sm_clock",
    ]  # fmt: skip


@pytest.mark.parametrize("scenario", ["nvlink", "ecc_dbe", "gpu_lost", "ib_flap", "hang", "user_bug", "nan_loss"])
@pytest.mark.parametrize(("seed", "nodes", "gpus"), [(1, 4, 8), (2, 2, 4)])
def test_other_faults_raise_no_straggler_on_a_healthy_gpu(scenario: str, seed: int, nodes: int, gpus: int) -> None:
    run = sim(scenario, seed, nodes, gpus, end=200.0)
    faulty = {f"{n}/{g}" for fault in run.cluster.faults for n, gs in fault.gpus.items() for g in gs}
    for _, fs in runs(run, end=200.0):
        for f in fs:
            check_contract(f)
            assert f.subject in faulty, f.summary
            if scenario == "nvlink":  # the bad link carries less: an NVLink claim, not a straggler
                assert f.category == "nvlink"


# --- hand-made frames ---

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def frame(
    units: int = 8,
    seconds: int = 150,
    *,
    seed: int = 0,
    bad: dict[int, dict[str, float]] | None = None,
    metrics: dict[str, float] | None = None,
    every: float = 1.0,
) -> pd.DataFrame:
    """Samples of `units` GPUs (two per node) with stable per-GPU offsets and noise; `bad` scales a metric."""
    rng = random.Random(seed)
    base = metrics or {"power_usage": 520.0, "sm_clock": 1980.0, "tensor_active": 0.4, "sm_active": 0.7}
    offsets = {u: {m: 1 + rng.gauss(0, 0.02) for m in base} for u in range(units)}
    rows = []
    for i in range(int(seconds / every)):
        ts = NOW - timedelta(seconds=seconds - i * every)
        for u in range(units):
            row: dict[str, object] = {"ts": ts, "node": f"n{u // 2}", "gpu": u % 2}
            for m, v in base.items():
                factor = (bad or {}).get(u, {}).get(m, 1.0)
                row[m] = v * offsets[u][m] * factor * (1 + rng.gauss(0, 0.03))
            rows.append(row)
    return pd.DataFrame(rows)


JOB = JobInfo(job_id="j1", world_size=8, rank_nodes={r: f"n{r // 2}" for r in range(8)})


def test_a_steady_outlier_is_found_with_its_band() -> None:
    (f,) = peers.detect(JOB, frame(bad={5: {"power_usage": 0.6}}), now=NOW)
    assert f.subject == "n2/1" and f.node == "n2" and f.category == "straggler"
    (m,) = f.evidence["metrics"]
    assert m["metric"] == "power_usage" and m["direction"] == "low"
    assert all(w["value"] < 0.7 * w["peer_median"] for w in m["windows"])


def test_a_few_percent_apart_is_no_outlier() -> None:
    # 12% low power is several MADs in a tight job, but under the relative floor: silicon varies that much.
    assert peers.detect(JOB, frame(bad={5: {"power_usage": 0.88}}), now=NOW) == []


def test_tiny_absolute_differences_on_a_quiet_metric_never_count() -> None:
    quiet = frame(metrics={"tensor_active": 0.001, "sm_active": 0.5}, bad={3: {"tensor_active": 40.0}})
    assert peers.detect(JOB, quiet, now=NOW) == []


def test_an_outlier_must_last_the_whole_continuity_period() -> None:
    data = frame(bad={5: {"power_usage": 0.6}})
    recent = data["ts"] > NOW - timedelta(seconds=60)
    data.loc[recent & (data["node"] == "n2") & (data["gpu"] == 1), "power_usage"] = 520.0
    assert peers.detect(JOB, data, now=NOW) == []
    # A shorter continuity period is satisfied by the older stretch alone.
    shifted = peers.detect(JOB, data, now=NOW - timedelta(seconds=60), continuity_s=60)
    assert [f.subject for f in shifted] == ["n2/1"]


def test_two_halves_that_disagree_are_a_split_not_an_outlier() -> None:
    data = frame(bad={u: {"power_usage": 0.6} for u in range(4)})
    assert peers.detect(JOB, data, now=NOW) == []


def test_no_comparison_with_fewer_than_three_gpus_or_without_samples() -> None:
    data = frame(units=8, bad={1: {"power_usage": 0.5}})
    two = data[data["node"] == "n0"]
    assert peers.detect(JOB, two, now=NOW) == []
    # A GPU whose series vanished (lost) is not compared; the others are.
    lost = data[~((data["node"] == "n3") & (data["gpu"] == 1))]
    assert [f.subject for f in peers.detect(JOB, lost, now=NOW)] == ["n0/1"]


def test_a_quiet_job_is_not_compared() -> None:
    # After a crash every GPU idles; whoever idles a little differently is no straggler.
    idle = frame(metrics={"power_usage": 70.0, "sm_active": 0.0, "tensor_active": 0.0}, bad={2: {"power_usage": 2}})
    assert peers.detect(JOB, idle, now=NOW) == []


def test_gpus_unused_by_the_job_are_no_peers() -> None:
    data = frame(units=8)
    spare = data[data["gpu"] == 0].copy()
    spare["gpu"] = 7
    for m in ("power_usage", "sm_active", "tensor_active"):
        spare[m] = 0.0 if m != "power_usage" else 65.0
    assert peers.detect(JOB, pd.concat([data, spare]), now=NOW) == []


def test_pipeline_stages_are_compared_among_themselves() -> None:
    # pp=4 over 16 ranks: the last stage (loss) works harder; rank 5 (stage 1, n2/1) straggles.
    job = JobInfo(job_id="pp", world_size=16, pp=4, dp=4, rank_nodes={r: f"n{r // 2}" for r in range(16)})
    bad = {u: {"power_usage": 1.35, "sm_active": 1.3} for u in range(12, 16)}
    assert peers.detect(job, frame(16, bad=bad), now=NOW) == []
    found = peers.detect(job, frame(16, bad={**bad, 5: {"power_usage": 0.6}}), now=NOW)
    assert [f.subject for f in found] == ["n2/1"]
    band = found[0].evidence["metrics"][0]["windows"][0]
    assert band["n_units"] == 4, "its stage's four GPUs"


def test_cumulative_counters_are_differenced_and_rates_are_not() -> None:
    rate = frame(metrics={"nvlink_tx_bytes": 50e9, "sm_active": 0.7}, bad={6: {"nvlink_tx_bytes": 0.5}})
    (as_rate,) = peers.detect(JOB, rate, now=NOW, metrics_priority=["nvlink_tx_bytes"])
    assert as_rate.subject == "n3/0" and as_rate.category == "nvlink"
    counter = rate.sort_values("ts").copy()
    counter["nvlink_tx_bytes"] = counter.groupby(["node", "gpu"])["nvlink_tx_bytes"].cumsum() + 7e14
    (as_counter,) = peers.detect(JOB, counter, now=NOW, metrics_priority=["nvlink_tx_bytes"])
    assert as_counter.subject == "n3/0"
    windows = as_counter.evidence["metrics"][0]["windows"]
    assert 20e9 < windows[0]["value"] < 30e9, "a rate in bytes per second, not the running total"


def test_findings_are_per_category_and_series_stable() -> None:
    data = frame(
        metrics={"power_usage": 520.0, "sm_active": 0.7, "nvlink_tx_bytes": 50e9}, bad={4: {"power_usage": 0.5}}
    )
    first = peers.detect(JOB, data, now=NOW - timedelta(seconds=5))
    second = peers.detect(JOB, data, now=NOW)
    assert [f.series for f in first] == [f.series for f in second] == ["n2/0:straggler"]


def test_samples_after_now_and_odd_input_are_ignored() -> None:
    data = frame(bad={5: {"power_usage": 0.6}})
    assert peers.detect(JOB, data, now=NOW - timedelta(minutes=10)) == []
    assert peers.detect(JOB, pd.DataFrame(), now=NOW) == []
    assert peers.detect(JOB, pd.DataFrame({"ts": ["yesterday"], "node": [None], "gpu": ["x"]}), now=NOW) == []
    assert peers.detect(JOB, data.drop(columns=["gpu"]), now=NOW) == []
    junk = data.copy()
    junk["power_usage"] = junk["power_usage"].astype(object)
    junk.loc[junk.index[::7], "power_usage"] = "n/a"
    naive = NOW.replace(tzinfo=None)
    assert [f.subject for f in peers.detect(JOB, junk, now=naive)] == ["n2/1"]
    assert peers.detect(JOB, data, now=NOW, window_s=0) == []
