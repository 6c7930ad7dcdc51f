"""ml/node_signals.py on plain window frames: each fault names its machine, healthy jobs name none."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from ml import node_signals, node_summary
from ml.demarcation import demarcate
from ml.evidence import evidence_of
from ml.findings import Finding, JobInfo
from ml.node_metrics import NODE_COLUMNS, NODE_COUNTERS

START = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
NODES = [f"node-{i:03d}" for i in range(6)]
PORTS = ["ib:mlx5_0/1", "ib:mlx5_1/1"]
WINDOWS = 30
JOB = JobInfo("job-1", world_size=48, rank_nodes={r: NODES[r // 8] for r in range(48)})
NOW = START + timedelta(seconds=10 * WINDOWS + 10)


def _frame(change: Any = None, seed: int = 1) -> pd.DataFrame:
    """Healthy windows of every node's ports and host; `change(node, subject, i, row)` edits a row in place."""
    rng = random.Random(seed)
    rows = []
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for i in range(WINDOWS):
        start = START + timedelta(seconds=10 * i)
        for node in NODES:
            for subject in [*PORTS, "host"]:
                row: dict[str, Any] = {"window_start": start, "last_ts": start + timedelta(seconds=9), "node": node}
                row["subject"] = subject
                acc = totals.setdefault((node, subject), {})
                if subject != "host":
                    row.update(port_state=4.0, port_phys_state=5.0, port_rate_gbps=400.0)
                    for counter, per_s in (
                        ("port_xmit_wait", 2000.0),
                        ("port_xmit_bytes", 4e10),
                        ("symbol_error", 0.0),
                    ):
                        acc[counter] = acc.get(counter, 0.0) + per_s * 10 * rng.uniform(0.8, 1.2)
                    for counter in ("link_downed", "pause_tx_frames", "pause_rx_frames"):
                        acc.setdefault(counter, 0.0)
                else:
                    row.update(
                        mem_total_mib=2_000_000.0,
                        mem_available_mib=1_500_000.0 * rng.uniform(0.95, 1.05),
                        psi_mem_some_avg10=rng.uniform(0, 0.5),
                        psi_mem_full_avg10=0.0,
                        swap_used_mib=0.0,
                    )
                if change is not None:
                    change(node, subject, i, row, acc)
                for counter, value in acc.items():
                    row[counter] = value
                    row[f"{counter}_max"] = value
                rows.append(row)
    return pd.DataFrame(rows)


def _detect(frame: pd.DataFrame) -> list[Any]:
    return node_signals.detect(JOB, frame, now=NOW)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_healthy_job_names_nobody(seed: int) -> None:
    assert _detect(_frame(seed=seed)) == []


def test_each_flap_is_a_finding_with_every_flap_time() -> None:
    def flap(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-002" and subject == "ib:mlx5_1/1" and i in (12, 22):
            row["port_state"] = 2.5  # down for part of the window, back by its end
            acc["link_downed"] += 1
            acc["symbol_error"] += 40

    found = _detect(_frame(flap))
    assert {f.node for f in found} == {"node-002"}
    flaps = [f for f in found if f.evidence["rule"] == "flap"]
    assert len(flaps) == 2 and len({f.key for f in flaps}) == 2
    assert all(f.category == "network" and f.action == "evict" for f in flaps)
    assert len(flaps[0].evidence["times"]) == 2
    # Each flap named by link_downed after it, as the agent's port watch names it (counted once by the policy).
    assert [(x["port"], x["link_downed"]) for x in flaps[0].evidence["port_flaps"]] == [
        ("ib:mlx5_1/1", 1),
        ("ib:mlx5_1/1", 2),
    ]
    assert evidence_of("node_signals", json.loads(json.dumps(flaps[0].evidence))) is not None


def test_a_state_drop_without_the_counter_is_a_flap_too() -> None:
    def drop(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-001" and subject == "ib:mlx5_0/1" and i in (15, 16):
            row["port_state"] = 1.0

    found = _detect(_frame(drop))
    assert [f.evidence["rule"] for f in found] == ["flap"]
    assert found[0].node == "node-001"
    assert [x["link_downed"] for x in found[0].evidence["port_flaps"]] == [None]  # no count names it


def test_a_counter_that_dips_and_comes_back_is_no_flap() -> None:
    """A healthy port whose link_downed (1 since before the job) reads lower for one window and then 1 again,
    as around an agent restart: the counter never rose, nobody is accused."""

    def dip(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if subject != "host" and i == 0:
            acc["link_downed"] = 1.0
        if node == "node-001" and subject in PORTS:
            acc["link_downed"] = 0.0 if i == 12 else 1.0

    assert _detect(_frame(dip)) == []


def test_a_cleared_counter_that_counts_again_is_still_a_flap() -> None:
    def cleared(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-003" and subject == PORTS[0]:
            acc["link_downed"] = 5.0 if i < 10 else 0.0 if i < 20 else 1.0  # cleared, then one flap

    found = _detect(_frame(cleared))
    assert [(f.node, f.evidence["rule"]) for f in found] == [("node-003", "flap")]


def test_a_port_whose_state_is_unknown_is_not_down() -> None:
    def unknown(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-005" and subject == PORTS[1] and i == 14:
            row["port_state"] = 0.0  # NOP: the kernel had nothing to report

    assert _detect(_frame(unknown)) == []


def test_a_port_down_while_its_peers_are_up() -> None:
    def dead(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-004" and subject == "ib:mlx5_0/1":
            row["port_state"], row["port_phys_state"] = 1.0, 3.0

    found = _detect(_frame(dead))
    assert [(f.node, f.evidence["rule"]) for f in found] == [("node-004", "down")]
    assert len(found[0].evidence["times"]) >= 2  # the policy's flap tolerance counts them


def test_a_port_trained_at_a_lower_rate() -> None:
    def slow(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-003" and subject == "ib:mlx5_1/1":
            row["port_rate_gbps"] = 200.0

    found = _detect(_frame(slow))
    assert [(f.node, f.evidence["rule"]) for f in found] == [("node-003", "slow_link")]
    assert "200 Gb/s" in found[0].summary


def test_link_errors_far_above_the_peers() -> None:
    def errors(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-005" and subject == "ib:mlx5_0/1":
            acc["symbol_error"] += 30

    found = _detect(_frame(errors))
    assert [(f.node, f.evidence["rule"]) for f in found] == [("node-005", "errors")]
    assert found[0].action == "diagnose"


def test_one_burst_of_link_errors_is_one_occurrence_at_its_window() -> None:
    """A flap's burst of link errors happens once: the flap tolerance must not count the start of the span the rule
    read as a second fault (it did: the simulator's first IB flap was evicted as two faults)."""

    def burst(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-005" and subject == "ib:mlx5_0/1" and i == 27:
            acc["symbol_error"] += 400

    (found,) = [f for f in _detect(_frame(burst)) if f.evidence["rule"] == "errors"]
    assert found.evidence["times"] == [(START + timedelta(seconds=10 * 27 + 9)).isoformat()]


def test_congestion_with_pause_frames_names_the_node() -> None:
    def congested(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-001" and subject != "host" and i >= 10:
            acc["port_xmit_wait"] += 2000.0 * 10 * 100
            acc["pause_tx_frames"] += 5000.0 * 10

    found = _detect(_frame(congested))
    assert {(f.node, f.evidence["rule"]) for f in found} == {("node-001", "congestion")}
    assert found[0].action == "evict" and "pause_tx_frames" in found[0].evidence["rates"]


def _congested_from(first: int, factor: float, last: int = WINDOWS, pauses: float = 5000.0) -> Any:
    def congested(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-001" and subject != "host" and first <= i < last:
            acc["port_xmit_wait"] += 2000.0 * 10 * factor
            acc["pause_tx_frames"] += pauses * 10

    return congested


def test_congestion_far_over_its_peers_is_a_change_point_after_two_windows() -> None:
    # Two windows far over the bar (5 x the peers' 2,000/s): found long before the 2-minute continuity period.
    found = _detect(_frame(_congested_from(WINDOWS - 2, 100)))
    assert [(f.node, f.evidence["rule"], f.action) for f in found] == [("node-001", "congestion", "evict")]
    assert found[0].evidence["apart_s"] == 19.0
    assert "for 19 s" in found[0].summary
    # One window is not yet a change, however far over.
    assert _detect(_frame(_congested_from(WINDOWS - 1, 100))) == []


def test_congestion_just_over_the_bar_waits_for_the_continuity_period() -> None:
    # Waiting at 7 x the peers (the bar is 5 x): log2(7/5) a window needs about 13 windows to reach the threshold.
    assert _detect(_frame(_congested_from(WINDOWS - 4, 6, pauses=0.0))) == []
    found = _detect(_frame(_congested_from(WINDOWS - 12, 6, pauses=0.0)))
    assert [(f.node, f.evidence["rule"], f.action) for f in found] == [("node-001", "congestion", "diagnose")]


def test_a_congestion_burst_that_ended_is_no_finding() -> None:
    assert _detect(_frame(_congested_from(WINDOWS - 5, 100, last=WINDOWS - 2))) == []


def test_waiting_alone_is_only_diagnosed() -> None:
    def waiting(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-001" and subject == "ib:mlx5_0/1" and i >= 10:
            acc["port_xmit_wait"] += 2000.0 * 10 * 50

    found = _detect(_frame(waiting))
    assert [(f.node, f.action) for f in found] == [("node-001", "diagnose")]


def test_host_memory_pressure_on_one_node() -> None:
    def pressed(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-002" and subject == "host" and i >= 20:
            row.update(mem_available_mib=30_000.0, psi_mem_some_avg10=45.0, psi_mem_full_avg10=20.0)

    found = _detect(_frame(pressed))
    assert [(f.node, f.category, f.action, f.blame) for f in found] == [("node-002", "host", "diagnose", "unknown")]


def test_pressure_on_every_node_is_the_workloads() -> None:
    def everyone(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if subject == "host":
            row.update(psi_mem_some_avg10=30.0)

    assert _detect(_frame(everyone)) == []


def test_an_uncorrected_memory_error_evicts_its_host_and_a_count_it_brought_or_a_reset_does_not() -> None:
    def edac(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if subject != "host":
            return
        acc.setdefault("edac_ue", 0.0)
        acc.setdefault("edac_ce", 3.0)
        if node == "node-001" and i == 21:
            acc["edac_ue"] += 1  # the DRAM failed under the job
        if node == "node-003":
            acc["edac_ue"] = 2.0 if i < 15 else 0.0  # errors from before the job, then a reboot cleared them
        if node == "node-004" and i >= 10:
            acc["edac_ce"] += 1  # corrected errors are the ECC doing its job

    frame = _frame(edac)
    found = _detect(frame)
    assert [(f.node, f.category, f.action, f.blame, f.evidence["rule"]) for f in found] == [
        ("node-001", "host", "evict", "infrastructure", "memory_errors")
    ]
    assert found[0].evidence["value"] == 1 and "1 uncorrected memory error " in found[0].summary
    aggregates = node_summary.aggregate(node_signals._prepare(frame))
    assert node_summary.worth_a_look(aggregates, node_summary.peer_summary(aggregates)) == ["node-001"]

    # The window where the count rose lost its reading (a collector's miss): the rise is read across the gap.
    gap = (
        (frame["node"] == "node-001")
        & (frame["subject"] == "host")
        & (frame["window_start"] == START + timedelta(seconds=210))
    )
    frame.loc[gap, ["edac_ue", "edac_ue_max"]] = float("nan")
    found = _detect(frame)
    assert [(f.node, f.evidence["rule"], f.evidence["value"]) for f in found] == [("node-001", "memory_errors", 1)]


def test_candidates_and_summary_stand_in_for_the_whole_job() -> None:
    """The service reads only the machines worth a look, with the job's summary: the same findings."""

    def flap(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-002" and subject == "ib:mlx5_1/1" and i in (12, 22):
            acc["link_downed"] += 1
        if node == "node-004" and subject == "host" and i >= 20:
            row.update(psi_mem_some_avg10=45.0, psi_mem_full_avg10=20.0)

    frame = _frame(flap)
    whole = _detect(frame)
    aggregates = node_summary.aggregate(node_signals._prepare(frame))
    summary = node_summary.peer_summary(aggregates)
    nodes = node_summary.worth_a_look(aggregates, summary)
    assert nodes == ["node-002", "node-004"]
    part = node_signals.detect(JOB, frame[frame["node"].isin(nodes)], now=NOW, peers=summary)
    assert sorted(f.key for f in part) == sorted(f.key for f in whole)


def test_odd_input_is_skipped() -> None:
    assert node_signals.detect(JOB, None, now=NOW) == []
    assert node_signals.detect(JOB, pd.DataFrame({"x": [1]}), now=NOW) == []
    assert set(node_summary.AGGREGATE_COLUMNS) >= {f"rise_{c}" for c in node_summary.PORT_ERRORS}
    assert set(NODE_COUNTERS) <= set(NODE_COLUMNS)


def test_a_flap_in_counters_and_in_nccl_lines_is_one_incident() -> None:
    """Demarcation: the port's flaps and the NCCL lines about the same node are one network incident, and the
    job's stall folds into it."""

    def flap(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-002" and subject == "ib:mlx5_1/1" and i in (12, 22):
            acc["link_downed"] += 1

    flaps = _detect(_frame(flap))
    nccl = Finding(
        detector="signatures",
        category="network",
        subject_kind="node",
        subject="node-002",
        confidence=0.9,
        summary="NCCL WARN NET/IB : Got completion with error 12 on node-002",
        observed_at=NOW,
        node="node-002",
        blame="infrastructure",
        action="evict",
    )
    stall = Finding("progress", "straggler", "job", "job-1", 0.6, "the job slowed", NOW, action="diagnose")
    proposals = demarcate([(i, f) for i, f in enumerate([*flaps, nccl, stall])])
    assert len(proposals) == 1
    (incident,) = proposals
    assert incident.root_cause == "network" and [s.node for s in incident.suspects] == ["node-002"]
    assert len(incident.finding_ids) == len(flaps) + 2


def test_a_machine_slowed_by_its_host_is_one_incident() -> None:
    """The peers' straggler finding on the node whose host is under memory pressure joins the host incident;
    a straggler on another machine stays its own."""
    pressure = Finding("node_signals", "host", "node", "node-002", 0.75, "memory pressure", NOW, node="node-002")
    slow = Finding("peers", "straggler", "gpu", "node-002/3", 0.9, "slow GPU", NOW, node="node-002", action="evict")
    other = Finding("peers", "straggler", "gpu", "node-004/1", 0.9, "slow GPU", NOW, node="node-004", action="evict")
    proposals = demarcate([(1, pressure), (2, slow), (3, other)])
    by_cause = {p.root_cause: p for p in proposals}
    assert set(by_cause) == {"host", "straggler"}
    assert sorted(by_cause["host"].finding_ids) == [1, 2] and by_cause["straggler"].finding_ids == [3]


def test_a_machine_that_joined_late_is_judged_from_when_it_joined() -> None:
    """A late joiner's counters hold what they counted before this job: its first windows are missing, so its
    rise is counted from the continuity period on, never as the counter's whole value."""

    def late(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-005" and i == 0:
            acc.update(port_xmit_wait=acc.get("port_xmit_wait", 0.0) + 5e11, symbol_error=4000.0, link_downed=7.0)

    frame = _frame(late)
    joined = frame[(frame["node"] != "node-005") | (frame["window_start"] >= START + timedelta(seconds=200))]
    assert _detect(joined) == []
    aggregates = node_summary.aggregate(node_signals._prepare(joined))
    assert node_summary.worth_a_look(aggregates, node_summary.peer_summary(aggregates)) == []


def test_a_port_flap_after_another_machines_fault_is_its_own_fault_and_congestion_its_victim() -> None:
    """A port flap reads the machine's own counters: minutes after another machine lost a GPU it is still its own
    network fault (as a victim of the lost GPU it joined that incident and nobody evicted the machine: the
    campaign's missed IB flap). Congestion compares a machine with its peers, and a restart around a lost GPU
    changes its traffic: a victim, in no incident of its own."""

    def flap(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-002" and subject == "ib:mlx5_1/1" and i in (12, 22):
            acc["link_downed"] += 1

    flaps = [f for f in _detect(_frame(flap)) if f.evidence["rule"] == "flap"]
    lost = Finding(
        "signatures", "gpu_hardware", "node", "node-005", 0.98, "Xid 79 on node-005",
        min(f.observed_at for f in flaps) - timedelta(minutes=2), node="node-005", blame="infrastructure",
        action="evict",
    )  # fmt: skip
    congestion = Finding(
        "node_signals", "network", "node", "node-003", 0.8, "node-003's ports stand out", lost.observed_at
        + timedelta(minutes=1), node="node-003", action="evict", evidence={"rule": "congestion"},
    )  # fmt: skip
    proposals = demarcate([(i, f) for i, f in enumerate([lost, *flaps, congestion])])
    by_machine = {(p.root_cause, p.anchor): p for p in proposals}
    assert set(by_machine) == {("gpu_hardware", "node-005"), ("network", "node-002")}
    assert len(by_machine[("network", "node-002")].finding_ids) == len(flaps)
    assert len(flaps) + 1 in by_machine[("gpu_hardware", "node-005")].finding_ids  # the victim, as a symptom


def test_link_errors_on_every_node_at_once_give_a_finite_peer_median() -> None:
    # A switch down: every node's port errs, so the peers have no quiet reading to compare with. The evidence must
    # still be JSON (a NaN median stopped the campaign's diagnosis pass when PostgreSQL refused it).
    def errors(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if subject == "ib:mlx5_0/1":
            acc["symbol_error"] += 30
            row["symbol_error_max"] = float("nan") if i % 2 else acc["symbol_error"]

    found = node_signals.detect(JOB, _frame(errors), now=NOW)
    for f in found:
        json.dumps(f.evidence, allow_nan=False)
