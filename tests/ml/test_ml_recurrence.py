"""Recurrence (ml.recurrence via ml.peers): a GPU that is its peers' outlier again and again, and the look-alikes
of healthy jobs that must not be accused. Spans are summarized every window boundary and judged pass by pass,
as the service does (service/diagnosis/metric_passes.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pandas as pd

from ml import peers, recurrence, windows
from ml.findings import Finding, JobInfo
from ml.metrics import WINDOW_S
from tests.stored import check_evidence

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
JOB = JobInfo(job_id="j1", world_size=8, rank_nodes={r: f"n{r // 2}" for r in range(8)})
BASE = {"power_usage": 520.0, "sm_clock": 1980.0, "tensor_active": 0.4, "sm_active": 0.7}
IDLE = {"power_usage": 70.0, "sm_clock": 1980.0, "tensor_active": 0.0, "sm_active": 0.0}
# A thermally throttled GPU, as the simulator's (lab/sim): its clock and power drop, and it is busy for longer
# each step while the healthy ones wait for it in the collectives.
THROTTLED = {"power_usage": 0.65, "sm_clock": 0.7, "sm_active": 1.35, "tensor_active": 1.35}
SECONDS = 600

# (unit, t) -> per-metric factors; (t) -> whether the whole job pauses (a checkpoint: every GPU idle).
Factors = Callable[[int, int], dict[str, float]]


def samples(
    bad: Factors,
    paused: Callable[[int], bool] = lambda t: False,
    seed: int = 0,
    late: Callable[[int, int], bool] = lambda u, t: False,
) -> pd.DataFrame:
    """1 s samples of 8 GPUs (two per node) over SECONDS, with stable per-GPU offsets and noise; a GPU `late` at a
    second still works while the job has paused."""
    rng = random.Random(seed)
    offsets = {u: {m: 1 + rng.gauss(0, 0.02) for m in BASE} for u in range(8)}
    rows = []
    for t in range(SECONDS):
        for u in range(8):
            row: dict[str, object] = {"ts": T0 + timedelta(seconds=t), "node": f"n{u // 2}", "gpu": u % 2}
            for m, v in (IDLE if paused(t) and not late(u, t) else BASE).items():
                row[m] = v * offsets[u][m] * bad(u, t).get(m, 1.0) * (1 + rng.gauss(0, 0.03))
            rows.append(row)
    return pd.DataFrame(rows)


def passes(data: pd.DataFrame, start: int = 60) -> list[tuple[int, list[Finding]]]:
    """A span per window boundary (as the service keeps them), then the peers' findings at each boundary."""
    rolled = windows.from_samples(data)
    spans: dict[str, dict[str, object]] = {}
    out = []
    for t in range(int(peers.SPAN_S), SECONDS + 1, int(WINDOW_S)):
        end = T0 + timedelta(seconds=t)
        spans[end.isoformat()] = peers.summarize_span(JOB, rolled, end=end)
        if t >= start:
            out.append((t, peers.from_spans(JOB, spans, latest_end=end)))
    return out


def on_off(unit: int, first: int, on: int = 30, off: int = 90) -> Factors:
    return lambda u, t: THROTTLED if u == unit and t >= first and (t - first) % (on + off) < on else {}


def test_a_gpu_throttling_30_s_every_2_minutes_is_found_from_its_third_episode() -> None:
    history = passes(samples(on_off(5, first=30)))  # episodes at 30, 150, 270, 390, 510 s
    hits = [(t, f) for t, fs in history for f in fs]
    assert hits, "a recurrent straggler must be found"
    assert {f.subject for _, f in hits} == {"n2/1"}, "on its GPU and nowhere else"
    t_first, first = hits[0]
    assert 270 < t_first <= 300, "not before its third episode, and as soon as it shows"
    assert first.node == "n2" and first.category == "straggler" and first.action == "evict"
    assert first.blame == "infrastructure" and "comes and goes" in first.summary
    check_evidence([first])
    ev = first.evidence
    assert ev["rule"] == "recurrence" and ev["unit"] == "n2/1"
    lead = [e for e in ev["episodes"] if e["metric"] == ev["metrics"][0]["metric"]]
    assert len({e["start"] for e in lead}) == recurrence.MIN_EPISODES
    assert len({e["direction"] for e in lead}) == 1 and all(abs(e["z"]) >= 4 for e in lead)
    # Before the fourth episode (390 s) it is sure enough for the policy to evict (>= 0.8 by default), on a
    # clock lower than its peers' among others.
    sure = max((f for t, f in hits if t < 390), key=lambda f: f.confidence)
    assert sure.confidence >= 0.8 > first.confidence
    clock = [e for e in sure.evidence["episodes"] if e["metric"] == "sm_clock"]
    assert len(clock) == 3 and all(e["direction"] == "low" for e in clock)
    # The continuity rule never names it (30 s on, 90 s off): only the recurrence does.
    assert all(f.evidence.get("rule") == "recurrence" for _, f in hits)
    # The raw-sample detector (back-to-back spans) names the same GPU at the end.
    raw = samples(on_off(5, first=30))
    assert [f.subject for f in peers.detect(JOB, raw, now=T0 + timedelta(seconds=SECONDS))] == ["n2/1"]


def test_one_metric_alone_coming_and_going_accuses_no_one() -> None:
    """The demo's healthy GPU: high tensor_active 30 s every 2 minutes, its clock, power and SM activity its peers'."""
    history = passes(samples(lambda u, t: {"tensor_active": 1.35} if u == 5 and (t - 30) % 120 < 30 else {}))
    assert [f for _, fs in history for f in fs] == []


def test_a_one_off_outlier_and_a_job_wide_pause_accuse_no_one() -> None:
    # GPU 3 lags for 30 s once (the change point wants it apart through 60 s), then the job checkpoints twice
    # (everyone idle; GPU 3 idles warmer than the rest).
    def paused(t: int) -> bool:
        return 280 <= t < 330 or 430 <= t < 480

    def bad(u: int, t: int) -> dict[str, float]:
        if u != 3:
            return {}
        return THROTTLED if 100 <= t < 130 else {"power_usage": 1.6} if paused(t) else {}

    history = passes(samples(bad, paused))
    assert [(t, f.subject) for t, fs in history for f in fs] == []
    # The same GPU lagging in three separate stretches is found: the quiet above is the rule's, not blindness.
    thrice = passes(samples(lambda u, t: THROTTLED if u == 3 and t >= 100 and (t - 100) % 150 < 60 else {}))
    assert {f.subject for _, fs in thrice for f in fs} == {"n1/1"}


def test_a_machine_standing_apart_only_as_the_job_stops_and_restarts_is_not_a_recurrent_straggler() -> None:
    """The 30-min demo's healthy node-000: a fault every 3 minutes, the job stopping and restarting around each, and
    one machine's GPUs still working a few seconds after the others stopped; 3 "episodes" in 10 min, all at the
    job's stops, and an incident on a healthy machine."""
    stops = (100, 280, 460)

    def paused(t: int) -> bool:
        return any(r <= t < r + 40 for r in stops)

    def late(u: int, t: int) -> bool:
        return u in (4, 5) and any(r <= t < r + 6 for r in stops)

    data = samples(lambda u, t: {}, paused, late=late)
    history = passes(data)
    assert [(t, f.subject) for t, fs in history for f in fs] == []
    # The spans it stands apart in are the job's stops: active by the span's median, not through every window.
    rolled = windows.from_samples(data)
    stop = peers.summarize_span(JOB, rolled, end=T0 + timedelta(seconds=110))
    assert stop["active"] and not stop["steady"]
    assert "n2/0" in stop["metrics"]["power_usage"]["out"]
    working = peers.summarize_span(JOB, rolled, end=T0 + timedelta(seconds=90))
    assert working["active"] and working["steady"]


def test_outlier_episodes_moving_between_gpus_accuse_no_one() -> None:
    # 30 s episodes every 2 minutes, on n0/0, n2/0, n0/0, n2/0, n0/0: n0/0 has three, but n2/0 nearly as many.
    order = [0, 4, 0, 4, 0]

    def bad(u: int, t: int) -> dict[str, float]:
        k, phase = divmod(t - 30, 120)
        return THROTTLED if t >= 30 and phase < 30 and k < len(order) and order[k] == u else {}

    history = passes(samples(bad))
    assert [(t, f.subject) for t, fs in history for f in fs] == []


# A GPU waiting for its input (the software_slow scenario: a runaway loader worker): idle longer each step, so
# less busy than its peers, and its clock and power drop as an idle GPU's do.
STARVED = {"power_usage": 0.6, "sm_clock": 0.72, "sm_active": 0.75, "tensor_active": 0.75}


def test_a_starved_machine_coming_and_going_is_not_a_recurrent_straggler() -> None:
    cycles = on_off(4, first=30)
    both = lambda u, t: STARVED if u in (4, 5) and cycles(4, t) else {}  # noqa: E731
    history = passes(samples(both))
    assert not [f for _, fs in history for f in fs if f.evidence.get("rule") == "recurrence"]


def test_a_machine_whose_gpus_wait_for_input_is_worth_a_look_not_an_eviction() -> None:
    both = lambda u, t: STARVED if u in (4, 5) and t >= 60 else {}  # noqa: E731
    history = passes(samples(both))
    assert {f.subject for _, fs in history for f in fs} == {"n2/0", "n2/1"}, "its GPUs stand apart"
    _, last = history[-1]  # its power drops first (a throttle's would too); then its GPUs show idle
    assert len(last) == 2 and all(f.action == "diagnose" and f.blame == "unknown" for f in last)
    assert all("waiting for its input" in f.summary for f in last)


def traffic_samples(
    unit_factor: float,
    metrics: tuple[str, ...] = ("nvlink_rx_bytes", "pcie_rx_bytes"),
    then_factor: float = 1.0,
) -> pd.DataFrame:
    """GPUs busy alike, but machine n2 (GPUs 4 and 5) moves `unit_factor` times its peers' NVLink and PCIe traffic
    for 30 s every 2 minutes (a reload after a restart, a loader's burst: the demo's and the metric-only eval's
    healthy nodes), and `then_factor` times their traffic for 30 s a minute after each burst."""
    data = samples(lambda u, t: {})
    rng = random.Random(3)
    phase = ((data["ts"] - T0).dt.total_seconds() - 30) % 120
    on_n2 = data["node"] == "n2"
    factor = pd.Series(1.0, index=data.index).mask(on_n2 & (phase < 30), unit_factor)
    factor = factor.mask(on_n2 & (phase >= 60) & (phase < 90), then_factor)
    bases = {"nvlink_rx_bytes": 1.5e11, "nvlink_tx_bytes": 1.5e11, "pcie_rx_bytes": 2.0e10}
    for metric, base in ((m, bases[m]) for m in metrics):
        noise = [1 + rng.gauss(0, 0.03) for _ in range(len(data))]
        data[metric] = base * pd.Series(noise) * factor
    return data


def test_a_machine_moving_more_data_than_its_peers_again_and_again_is_not_accused() -> None:
    busier = [f for _, fs in passes(traffic_samples(2.0)) for f in fs if f.evidence.get("rule") == "recurrence"]
    assert busier == []
    # The same machine moving half its peers' data in the same bursts is a recurrent outlier: the rule is not blind.
    slower = [f for _, fs in passes(traffic_samples(0.5)) for f in fs if f.evidence.get("rule") == "recurrence"]
    assert {f.node for f in slower} == {"n2"}


def test_one_links_bytes_both_ways_are_one_signal_not_two() -> None:
    """The 15-min demo's healthy node-000 GPU 4: low NVLink rx and tx bytes in 3 episodes after another node's
    eviction, and nothing else; a step's bytes go out and come back, so the two directions corroborate nothing."""
    link = traffic_samples(0.5, metrics=("nvlink_rx_bytes", "nvlink_tx_bytes"))
    assert [f for _, fs in passes(link) for f in fs if f.evidence.get("rule") == "recurrence"] == []


def test_a_machine_whose_traffic_beats_above_and_below_its_peers_is_not_accused() -> None:
    """The 15-min demo's healthy node-003: all 8 GPUs' NVLink and PCIe bytes recurring both above and below their
    peers' (its agent's 1 s samples beating against the ~1.04 s step), evicted on two "signals" of one beat."""
    beating = traffic_samples(2.0, then_factor=0.5)
    assert [f for _, fs in passes(beating) for f in fs if f.evidence.get("rule") == "recurrence"] == []
    # Its low side alone, the same number of times, is a recurrent outlier: the beat is what clears it.
    low = traffic_samples(1.0, then_factor=0.5)
    assert {f.node for _, fs in passes(low) for f in fs if f.evidence.get("rule") == "recurrence"} == {"n2"}


def test_a_gpu_far_apart_on_several_metrics_is_named_by_the_change_point_within_a_minute() -> None:
    """Issue 44: a straggler within 60 s. Throttled from t=100 (clock, power and both busy gauges apart), the GPU is
    named once four spans in a row stand apart (their ends 50 s after the onset), not after the 120 s continuity."""
    history = passes(samples(lambda u, t: THROTTLED if u == 3 and t >= 100 else {}))
    hits = [(t, f) for t, fs in history for f in fs]
    assert {f.subject for _, f in hits} == {"n1/1"}
    t_first, first = hits[0]
    assert 140 <= t_first <= 160, t_first
    assert first.evidence["rule"] == "changepoint" and first.action == "evict" and first.confidence >= 0.8
    assert {m["metric"] for m in first.evidence["metrics"]} == set(THROTTLED)
    check_evidence([first])
    # Once the continuity period is over, the continuity rule names it (the same GPU, the same key's series).
    later = [f for t, fs in history if t >= 100 + 130 for f in fs]
    assert later and all(f.evidence.get("rule") is None for f in later)
    assert {f.series for f in later} == {first.series}


def test_one_metric_far_apart_waits_for_the_continuity_rule() -> None:
    """One metric alone (a GPU hotter than its peers, nothing else) is not the change point's to name."""
    history = passes(samples(lambda u, t: {"tensor_active": 1.6} if u == 3 and t >= 100 else {}))
    hits = [(t, f) for t, fs in history for f in fs]
    assert hits and {f.subject for _, f in hits} == {"n1/1"}
    assert hits[0][0] >= 100 + 110 and hits[0][1].evidence.get("rule") is None
