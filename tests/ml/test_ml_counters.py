"""GPU counters: simulated clusters (healthy, ECC, NVLink, lost GPU) sampled in-process as the service stores
them, then synthetic series for resets, gaps, silent nodes and odd input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from ml import counter_samples, counters
from ml.findings import ACTIONS, CATEGORIES, SUBJECT_KINDS, Finding, JobInfo
from ml.metrics import FIELD_TO_COLUMN
from tests.stored import check_evidence

START = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)
NODES, GPUS = 3, 4


def sim_frame(
    scenario: str, *, seed: int = 11, until: float = 60.0, every: float = 1.0
) -> tuple[Cluster, pd.DataFrame]:
    """The simulated cluster's DCGM values every `every` seconds, one row per GPU, columns as the service names them."""
    cluster = Cluster(
        SimConfig(nodes=NODES, gpus_per_node=GPUS, scenario=scenario, seed=seed, fault_after=10.0, start=START)
    )
    rows: list[dict[str, Any]] = []
    t = 0.0
    while t < until:
        t += every
        cluster.advance(t)
        ts = START + timedelta(seconds=t)
        for node, samples in cluster.snapshot().items():
            for sample in samples:
                row: dict[str, Any] = {"ts": ts, "node": node, "gpu": sample.index}
                # Blanks (DCGM's "not supported" values) are dropped as the agent and the ingest drop them.
                row.update(
                    {FIELD_TO_COLUMN[f]: v for f, v in sample.values.items() if f in FIELD_TO_COLUMN and abs(v) < 9e18}
                )
                rows.append(row)
    return cluster, pd.DataFrame(rows)


def job(names: list[str] | None = None) -> JobInfo:
    names = names or [f"node-{i:03d}" for i in range(NODES)]
    return JobInfo(
        job_id="job-1", world_size=len(names) * GPUS, rank_nodes={r: names[r // GPUS] for r in range(len(names) * GPUS)}
    )


def detect(df: pd.DataFrame, now: datetime | None = None, info: JobInfo | None = None) -> list[Finding]:
    now = now or (df["ts"].max() if not df.empty else START)
    findings = counters.detect(info or job(), df, now=now)
    for f in findings:
        assert f.detector == "counters" and f.category in CATEGORIES and f.action in ACTIONS
        assert f.subject_kind in SUBJECT_KINDS and f.node and f.key and f.blame == "infrastructure"
        assert 0 < f.confidence <= 1 and f.observed_at.tzinfo is not None
        assert f.evidence["signals"] and all(s["type"] == "metric" for s in f.evidence["signals"])
    assert len({f.key for f in findings}) == len(findings)
    check_evidence(findings)
    return findings


def fault_gpu(cluster: Cluster) -> tuple[str, int]:
    fault = cluster.faults[0]
    [node] = fault.nodes
    [gpu] = fault.gpus[node]
    return node, gpu


def series(
    column: str, values: list[float | None], *, gpus: int = 4, node: str = "node-000", every: float = 10.0
) -> pd.DataFrame:
    """GPU 0 takes `values`; the other GPUs of the node stay at 0."""
    rows = []
    for i, value in enumerate(values):
        for gpu in range(gpus):
            rows.append(
                {
                    "ts": START + timedelta(seconds=i * every),
                    "node": node,
                    "gpu": gpu,
                    column: value if gpu == 0 else 0.0,
                }
            )
    return pd.DataFrame(rows)


# -- simulated clusters --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("scenario", ["healthy", "straggler", "user_bug"])
def test_no_counter_finding_without_a_counter_fault(scenario: str, seed: int):
    _, df = sim_frame(scenario, seed=seed)
    assert len(df) > 500
    assert detect(df) == []


@pytest.mark.parametrize("seed", [11, 12])
def test_ecc_dbe_evicts_the_gpu(seed: int):
    cluster, df = sim_frame("ecc_dbe", seed=seed)
    node, gpu = fault_gpu(cluster)
    findings = detect(df)
    assert findings and {f.subject for f in findings} == {f"{node}/{gpu}"}
    ecc = next(f for f in findings if f.key.startswith("uncorrectable:"))
    assert (ecc.category, ecc.action, ecc.subject_kind) == ("gpu_hardware", "evict", "gpu")
    assert ecc.confidence >= 0.9 and ecc.evidence["counters"]["ecc_dbe_volatile"] == 1
    assert ecc.observed_at == START + timedelta(seconds=10)  # the sample taken at the injection (t=10)
    xids = sorted(f.evidence["xid"] for f in findings if f.key.startswith("xid_counter:"))
    assert xids == [48, 63]


@pytest.mark.parametrize("seed", [11, 12])
def test_nvlink_errors_rising_on_one_gpu_is_nvlink(seed: int):
    cluster, df = sim_frame("nvlink", seed=seed)
    node, gpu = fault_gpu(cluster)
    nvl = next(f for f in detect(df) if f.key.startswith("nvlink:"))
    assert (nvl.category, nvl.action, nvl.subject) == ("nvlink", "evict", f"{node}/{gpu}")
    assert nvl.evidence["peer_median"] == 0 and nvl.evidence["errors"] > 1000


@pytest.mark.parametrize("seed", [11, 12])
def test_a_gpu_whose_series_vanish_is_lost(seed: int):
    cluster, df = sim_frame("gpu_lost", seed=seed)
    node, gpu = fault_gpu(cluster)
    findings = detect(df)
    lost = [f for f in findings if f.key.startswith("gpu_lost:")]
    assert [(f.subject, f.category, f.action) for f in lost] == [(f"{node}/{gpu}", "gpu_hardware", "evict")]
    assert lost[0].evidence["silent_s"] > 30
    # Its PCIe link degraded first: replays far above its peers, a suspect to diagnose.
    pcie = [f for f in findings if f.category == "pcie"]
    assert [(f.subject, f.action) for f in pcie] == [(f"{node}/{gpu}", "diagnose")]


def test_a_silent_node_or_the_end_of_the_job_is_not_a_lost_gpu():
    _, df = sim_frame("healthy", seed=5)
    cut = START + timedelta(seconds=30)
    silent_node = df[(df["node"] != "node-001") | (df["ts"] <= cut)]
    assert detect(silent_node) == []
    job_ended = df[df["ts"] <= cut]
    assert detect(job_ended, now=START + timedelta(minutes=30)) == []
    # One GPU missing a single sample is a scrape hiccup, not a lost GPU.
    hiccup = df[~((df["node"] == "node-002") & (df["gpu"] == 3) & (df["ts"] == cut))]
    assert detect(hiccup) == []


def test_the_same_increase_keeps_its_key_as_the_window_slides():
    _, df = sim_frame("ecc_dbe", seed=11, until=40.0)
    a = detect(df[df["ts"] <= START + timedelta(seconds=30)])
    b = detect(df[df["ts"] >= START + timedelta(seconds=5)])
    assert {f.key for f in a} == {f.key for f in b} and a
    late = detect(df[df["ts"] >= START + timedelta(seconds=20)])  # the increase is before the window
    assert not [f for f in late if f.key.startswith("uncorrectable:")]


# -- synthetic series -----------------------------------------------------------------------------------------------


def test_counter_resets_are_not_increases():
    assert detect(series("ecc_dbe_volatile", [2, 2, 0, 0, 0])) == []
    [f] = detect(series("ecc_dbe_volatile", [2, 2, 0, 0, 1]))  # a new error after the reset is one
    assert f.evidence["counters"] == {"ecc_dbe_volatile": 1}
    assert f.observed_at == START + timedelta(seconds=40)


def test_missing_samples_do_not_hide_an_increase():
    [f] = detect(series("remapped_rows_uncorrectable", [0, None, None, 1, 1]))
    assert (
        f.category == "gpu_hardware" and f.evidence["signals"][0]["from"] == 0 and f.evidence["signals"][0]["to"] == 1
    )


def test_a_rise_across_an_absence_from_the_job_is_not_an_increase():
    """A machine evicted for climbing NVLink errors, repaired and swapped back in: the rise between its last sample
    before it left and its first after it came back happened outside the job."""
    before = series("nvlink_crc_flit_errors", [5400] * 6, gpus=8)
    back = series("nvlink_crc_flit_errors", [27100] * 6, gpus=8)
    back["ts"] += timedelta(seconds=counter_samples.AWAY_S + 60)
    assert detect(pd.concat([before, back])) == []
    back["nvlink_crc_flit_errors"] = [27100 + 500 * (i // 8) if i % 8 == 0 else 0 for i in range(len(back))]
    [f] = detect(pd.concat([before, back]))  # climbing again once back: that rise is the job's
    assert f.category == "nvlink" and f.evidence["errors"] == 2500


def test_row_remap_failure_and_xid_last():
    [f] = detect(series("row_remap_failure", [0, 0, 1, 1]))
    assert (f.category, f.action, f.confidence) == ("gpu_hardware", "evict", 0.95)
    [f] = detect(series("xid_last", [0, 0, 79, 79]))
    assert f.evidence["xid"] == 79 and f.action == "evict"
    assert detect(series("xid_last", [0, 13, 13, 31])) == []  # application-level: the log rules judge those
    assert detect(series("xid_last", [79, 79, 79])) == []  # an old value, no change seen in the window


def test_pcie_replays_are_judged_against_peers():
    rising = series("pcie_replay", [5, 10, 20, 40, 80])
    [f] = detect(rising)
    assert (f.category, f.action, f.subject) == ("pcie", "diagnose", "node-000/0")
    everyone = rising.assign(pcie_replay=lambda d: d["ts"].rank(method="dense") * 20)  # every GPU alike
    assert detect(everyone) == []
    assert detect(series("pcie_replay", [1, 2, 3, 4, 5])) == []  # a handful: noise


def test_several_bad_gpus_on_one_node_make_one_node_finding():
    df = series("nvlink_crc_flit_errors", [0, 500, 1000, 2000], gpus=8)
    df.loc[df["gpu"] == 1, "nvlink_crc_flit_errors"] = df.loc[df["gpu"] == 0, "nvlink_crc_flit_errors"].to_numpy()
    other = series("nvlink_crc_flit_errors", [0, 0, 0, 0], gpus=8, node="node-001")
    [f] = detect(pd.concat([df, other]))
    assert f.subject_kind == "node" and f.subject == "node-000" and f.evidence["gpus"] == [0, 1]


def test_other_jobs_nodes_are_ignored_and_odd_input_is_skipped():
    df = series("ecc_dbe_volatile", [0, 1], node="elsewhere")
    assert detect(pd.concat([df, series("ecc_dbe_volatile", [0, 0])])) == []
    assert counters.detect(job(), pd.DataFrame(), now=START) == []
    assert counters.detect(job(), pd.DataFrame({"x": [1]}), now=START) == []
    assert counters.detect(job(), None, now=START) == []  # type: ignore[arg-type]
    odd = pd.DataFrame(
        {
            "ts": ["2025-11-22T10:00:00Z", "garbage", None, "2025-11-22T10:00:10Z"],
            "node": ["node-000", "node-000", "node-000", "node-000"],
            "gpu": [0, "x", 0, 0],
            "ecc_dbe_volatile": ["0", "1", 2, "3"],
        }
    )
    [f] = counters.detect(job(), odd, now=START + timedelta(minutes=1))
    assert f.evidence["counters"] == {"ecc_dbe_volatile": 3}
    # Naive times are UTC; samples from the future (clock skew) are ignored.
    future = series("ecc_dbe_volatile", [0, 1], every=3600.0)
    assert counters.detect(job(), future, now=START) == []


def test_pending_row_remaps_and_page_retirements_ask_for_a_reset():
    [f] = detect(series("row_remap_pending", [0, 0, 1, 1]))
    assert (f.category, f.action, f.subject) == ("gpu_hardware", "evict", "node-000/0")
    assert "reset" in f.summary
    [f] = detect(series("retired_pages_pending", [0, 1, 1]))
    assert f.evidence["signals"][0]["metric"] == "retired_pages_pending"
    assert detect(series("row_remap_pending", [0, 0, 0])) == []


def _links(width: list[float], gen: list[float], util: float = 90.0) -> pd.DataFrame:
    df = series("pcie_link_width", width)
    df.loc[df["gpu"] != 0, "pcie_link_width"] = 16.0
    df["pcie_max_link_width"] = 16.0
    df["pcie_link_gen"] = 5.0
    df.loc[df["gpu"] == 0, "pcie_link_gen"] = (gen * 4)[: len(df[df["gpu"] == 0])]
    df["pcie_max_link_gen"] = 5.0
    df["gpu_util"] = util
    return df


def test_a_pcie_link_below_its_maximum_is_a_finding():
    [f] = detect(_links([16, 8, 8, 8], [5, 5, 5, 5]))
    assert (f.category, f.action, f.subject) == ("pcie", "evict", "node-000/0")
    assert "x8" in f.summary and "x16" in f.summary
    [f] = detect(_links([16, 16, 16, 16], [5, 3, 3, 3]))
    assert "gen 3" in f.summary
    # An idle GPU lowers its link generation to save power; a brief dip is not a link that trained low.
    assert detect(_links([16, 16, 16, 16], [5, 3, 3, 3], util=0.0)) == []
    assert detect(_links([16, 16, 8, 16], [5, 5, 5, 5])) == []
