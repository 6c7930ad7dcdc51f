"""Scoring of `faultline eval` on hand-made decisions and ground truths (no service, no processes)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from lab.evaluation import calibration
from lab.evaluation.api import Api, ApiError, EndpointMissing
from lab.evaluation.records import GroundTruth, parse_time
from lab.evaluation.report import concurrent_faults, format_summary, format_table
from lab.evaluation.scenarios import CATALOG, TORCH_FAULTS, parse_selection, wait_after_injection
from lab.evaluation.scoring import (
    FAIL,
    NA,
    PASS,
    percentile,
    score_scenario,
    summarize,
)
from lab.evaluation.spread import by_scenario, format_spread
from lab.sim.config import SimConfig
from lab.sim.model import Cluster

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
NODES = ["node-000", "node-001", "node-002", "node-003"]


def truth(scenario: str, kind: str | None, nodes: list[str], **fault: Any) -> GroundTruth:
    """A ground truth shaped like the sim's ground_truth.json."""
    faults = []
    if kind is not None:
        faults.append(
            {
                "kind": kind,
                "nodes": nodes,
                "gpus": {n: [1] for n in nodes},
                "ranks": [5],
                "injected_at": T0.isoformat(),
                "blame": fault.get("blame", "infrastructure"),
                "expect_eviction": fault.get("expect_eviction", True),
                **({"eviction_optional": True} if fault.get("eviction_optional") else {}),
            }
        )
    return GroundTruth.from_json(
        {"scenario": scenario, "job_id": f"job-{scenario}", "nodes": NODES, "world_size": 16, "faults": faults}
    )


_ids = iter(range(1, 10_000))


def decision(kind: str, node: str | None, after_s: float, state: str = "pending", incident: int = 1) -> dict[str, Any]:
    """A decision as GET /api/v1/decisions lists it."""
    return {
        "id": next(_ids),
        "incident_id": incident,
        "job_id": "job",
        "node": node,
        "kind": kind,
        "state": state,
        "confidence": 0.9,
        "reason": f"{kind} {node}",
        "evidence": {},
        "created_at": (T0 + timedelta(seconds=after_s)).isoformat().replace("+00:00", "Z"),
    }


def incident(blame: str, suspects: list[str], incident_id: int = 1, confidence: float = 0.9) -> dict[str, Any]:
    return {
        "id": incident_id,
        "job_id": "job",
        "state": "open",
        "root_cause": "gpu_hardware",
        "blame": blame,
        "confidence": confidence,
        "summary": "",
        "suspects": [{"node": n, "confidence": 0.9 - 0.1 * i, "reason": ""} for i, n in enumerate(suspects)],
        "opened_at": T0.isoformat(),
    }


class TestScenario:
    def test_right_eviction_is_one_true_positive_with_time_and_blame(self) -> None:
        s = score_scenario(
            truth("gpu_lost", "gpu_lost", ["node-002"]),
            [decision("diagnose", None, -30), decision("evict", "node-002", 4.5)],
            [incident("infrastructure", ["node-002", "node-001"])],
            seed=3,
        )
        assert (s.tp, s.fp, s.fn) == (1, 0, 0)
        assert s.correct and s.detected
        assert s.evicted == ["node-002"] and s.suspects == ["node-002", "node-001"]
        assert s.time_to_decision_s == pytest.approx(4.5)  # the earlier false alarm is not the answer
        assert s.early_decisions == 1
        assert (s.blame_decided, s.blame_expected, s.blame_ok) == ("infrastructure", "infrastructure", True)

    def test_wrong_eviction_is_a_false_positive_and_a_miss(self) -> None:
        s = score_scenario(truth("ecc_dbe", "ecc_dbe", ["node-001"]), [decision("evict", "node-003", 2)], [])
        assert (s.tp, s.fp, s.fn) == (0, 1, 1)
        assert not s.correct and s.evicted == ["node-003"] and s.expected == ["node-001"]

    def test_rejected_evictions_do_not_count_but_other_states_do(self) -> None:
        decisions = [
            decision("evict", "node-000", 1, state="rejected"),
            decision("evict", "node-001", 2, state="shadow"),
            decision("evict", "node-002", 3, state="expired"),
            decision("evict", "node-003", 4, state="awaiting_approval"),
        ]
        s = score_scenario(truth("nvlink", "nvlink", ["node-001"]), decisions, [])
        assert s.evicted == ["node-001", "node-002", "node-003"]
        assert (s.tp, s.fp, s.fn) == (1, 2, 0)

    def test_time_is_to_the_first_decision_naming_a_node_else_the_first_at_all(self) -> None:
        gt = truth("hang", "hang", ["node-000"])
        named = score_scenario(gt, [decision("restart", None, 20), decision("diagnose", "node-000", 35)], [])
        assert named.time_to_decision_s == pytest.approx(35)
        assert named.first_decision is not None and named.first_decision["kind"] == "diagnose"
        unnamed = score_scenario(gt, [decision("restart", None, 20)], [])
        assert unnamed.time_to_decision_s == pytest.approx(20)

    def test_a_decision_within_the_clock_slack_before_the_fault_counts_as_immediate(self) -> None:
        s = score_scenario(truth("gpu_lost", "gpu_lost", ["node-002"]), [decision("evict", "node-002", -1)], [])
        assert s.time_to_decision_s == 0.0 and s.early_decisions == 0

    def test_nothing_decided_is_not_detected_and_a_miss(self) -> None:
        s = score_scenario(truth("straggler", "straggler", ["node-003"]), [], [], error="GET ... answered 404")
        assert not s.detected and s.time_to_decision_s is None
        assert (s.tp, s.fp, s.fn) == (0, 0, 1) and not s.correct
        assert s.error == "GET ... answered 404"

    def test_an_incident_alone_is_a_detection(self) -> None:
        s = score_scenario(
            truth("nan_loss", "nan_loss", [], blame="user_code", expect_eviction=False), [], [incident("user_code", [])]
        )
        assert s.detected and s.correct and s.blame_ok

    def test_a_none_decision_alone_is_not_a_detection(self) -> None:
        s = score_scenario(truth("healthy", None, []), [decision("none", None, 5)], [])
        assert not s.detected

    def test_healthy_eviction_is_a_false_positive_and_wrong(self) -> None:
        s = score_scenario(
            truth("healthy", None, []), [decision("evict", "node-001", 50)], [incident("unknown", ["node-001"])]
        )
        assert s.healthy and (s.tp, s.fp, s.fn) == (0, 1, 0) and not s.correct
        assert s.blame_expected == "none" and s.blame_ok is False  # a healthy run should open no incident
        assert s.time_to_decision_s is None  # there is no fault to time from

    def test_user_code_eviction_is_flagged(self) -> None:
        gt = truth("user_bug", "user_bug", [], blame="user_code", expect_eviction=False)
        s = score_scenario(
            gt,
            [decision("rollback", None, 3), decision("evict", "node-000", 4)],
            [incident("infrastructure", ["node-000"])],
        )
        assert s.user_code and not s.correct and s.fp == 1
        assert s.blame_ok is False

    def test_blame_comes_from_the_incident_behind_the_first_decision(self) -> None:
        s = score_scenario(
            truth("user_bug", "user_bug", [], blame="user_code", expect_eviction=False),
            [decision("rollback", None, 3, incident=2)],
            [
                incident("infrastructure", [], incident_id=1, confidence=0.99),
                incident("user_code", [], incident_id=2, confidence=0.6),
            ],
        )
        assert s.blame_decided == "user_code" and s.blame_ok

    def test_optional_eviction_is_neither_a_hit_nor_a_false_positive(self) -> None:
        gt = truth("torch_crash", "crash", ["vnode-1"], blame="unknown", expect_eviction=False, eviction_optional=True)
        evicted = score_scenario(gt, [decision("evict", "vnode-1", 3)], [incident("unknown", ["vnode-1"])])
        assert (evicted.tp, evicted.fp, evicted.fn) == (0, 0, 0) and evicted.correct
        assert evicted.tolerated == ["vnode-1"] and evicted.blame_ok is None  # unknown blame is not scored
        diagnosed = score_scenario(gt, [decision("diagnose", "vnode-1", 3)], [])
        assert diagnosed.correct and diagnosed.evicted == []
        other = score_scenario(gt, [decision("evict", "vnode-2", 3)], [])
        assert other.fp == 1 and not other.correct

    def test_unreadable_entries_are_skipped(self) -> None:
        junk = [{"id": "x"}, {"kind": "evict"}, decision("evict", "node-002", 2)]
        s = score_scenario(truth("gpu_lost", "gpu_lost", ["node-002"]), junk, [{"no": "id"}])
        assert s.decisions == 1 and s.incidents == 0 and s.correct


def test_parse_time_accepts_z_and_offsets_and_rejects_junk() -> None:
    assert parse_time("2026-11-22T10:00:03Z") == T0 + timedelta(seconds=3)
    assert parse_time("2026-11-22T11:00:03+01:00") == T0 + timedelta(seconds=3)
    assert parse_time("yesterday") is None and parse_time(None) is None


class TestSummary:
    def runs(self) -> list[Any]:
        xid = truth("gpu_lost", "gpu_lost", ["node-002"])
        return [
            score_scenario(xid, [decision("evict", "node-002", 3)], [], seed=1),  # TP
            score_scenario(xid, [decision("evict", "node-002", 14), decision("evict", "node-000", 15)], [], seed=2),
            score_scenario(truth("hang", "hang", ["node-001"]), [], [], seed=1, hang_timeout_s=30),  # FN
            score_scenario(truth("healthy", None, []), [decision("evict", "node-003", 90)], [], seed=1),  # FP
            score_scenario(truth("user_bug", "user_bug", [], blame="user_code", expect_eviction=False), [], [], seed=1),
        ]

    def test_precision_recall_f1_count_machines_over_all_runs(self) -> None:
        s = summarize(self.runs())
        assert (s.tp, s.fp, s.fn) == (2, 2, 1)
        assert s.precision == pytest.approx(0.5) and s.recall == pytest.approx(2 / 3)
        assert s.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
        assert s.healthy_runs == 1 and s.healthy_evictions == 1
        assert s.user_code_runs == 1 and s.user_code_evictions == 0
        assert s.correct == 2 and s.detected == 3

    def test_timing_percentiles_over_runs_with_a_decision(self) -> None:
        s = summarize(self.runs())
        assert s.median_s == pytest.approx(8.5)  # 3 and 14; the hang and the healthy run have no time
        assert s.p95_s == pytest.approx(3 + 0.95 * 11)

    def test_targets(self) -> None:
        s = summarize(self.runs())
        status = {t.name: t.status for t in s.targets}
        assert status["precision >= 0.97"] == FAIL and status["recall >= 0.97"] == FAIL
        assert status["decision <= 10 s after a fatal Xid"] == FAIL  # seed 2 took 14 s
        assert status["fatal Xid decided, p95 <= 5 s"] == FAIL  # p95 of 3 and 14 s
        assert status["hang decided within hang timeout + 30 s"] == FAIL  # never decided
        assert status["straggler decided <= 180 s"] == NA  # none run
        assert status["no eviction on healthy runs"] == FAIL
        assert status["no eviction for user-code faults"] == PASS
        assert not s.passed

    def test_all_met(self) -> None:
        runs = [
            score_scenario(truth("ecc_dbe", "ecc_dbe", ["node-001"]), [decision("evict", "node-001", 4)], []),
            score_scenario(
                truth("hang", "hang", ["node-003"]), [decision("evict", "node-003", 55)], [], hang_timeout_s=30
            ),
            score_scenario(truth("straggler", "straggler", ["node-000"]), [decision("evict", "node-000", 170)], []),
            score_scenario(truth("healthy", None, []), [], []),
        ]
        s = summarize(runs)
        assert s.precision == 1.0 and s.recall == 1.0 and s.f1 == 1.0
        assert all(t.status in (PASS, NA) for t in s.targets) and s.passed

    def test_xid_p95_forgives_one_slow_run_in_many_but_not_a_missing_decision(self) -> None:
        gt = truth("gpu_lost", "gpu_lost", ["node-002"])
        name = "fatal Xid decided, p95 <= 5 s"

        def status(times: list[float | None]) -> str:
            runs = [
                score_scenario(gt, [decision("evict", "node-002", t)] if t is not None else [], [], seed=i)
                for i, t in enumerate(times)
            ]
            return {t.name: t.status for t in summarize(runs).targets}[name]

        assert status([1.0] * 39 + [9.0]) == PASS  # p95 interpolates to 1.4 s; every run still within 10 s
        assert status([1.0] * 10 + [9.0] * 2) == FAIL
        assert status([1.0] * 39 + [None]) == FAIL

    def test_hang_limit_is_the_runs_own_timeout(self) -> None:
        gt = truth("hang", "hang", ["node-003"])
        late = summarize([score_scenario(gt, [decision("evict", "node-003", 70)], [], hang_timeout_s=30)])
        ok = summarize([score_scenario(gt, [decision("evict", "node-003", 70)], [], hang_timeout_s=60)])
        name = "hang decided within hang timeout + 30 s"
        assert {t.name: t.status for t in late.targets}[name] == FAIL
        assert {t.name: t.status for t in ok.targets}[name] == PASS

    def test_no_evictions_at_all_leaves_precision_undefined(self) -> None:
        s = summarize([score_scenario(truth("gpu_lost", "gpu_lost", ["node-002"]), [], [])])
        assert s.precision is None and s.recall == 0.0 and s.f1 is None
        status = {t.name: t.status for t in s.targets}
        assert status["precision >= 0.97"] == NA and status["recall >= 0.97"] == FAIL

    def test_report_prints_a_row_per_run_and_the_targets(self) -> None:
        runs = self.runs()
        runs[0].node_prefix = "e1-gpulost-s1"
        runs[0].evicted = ["e1-gpulost-s1-node-002"]
        table = format_table(runs)
        lines = table.splitlines()
        assert len(lines) == 2 + len(runs)
        assert lines[2].split()[:4] == ["gpu_lost", "1", "yes", "node-002"]  # the run's prefix left out
        summary = format_summary(summarize(runs))
        assert "precision 0.500, recall 0.667" in summary and "FAIL" in summary


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile(list(map(float, range(1, 21))), 95) == pytest.approx(19.05)


def test_scenario_deadlines() -> None:
    assert wait_after_injection("hang", 30) == 90
    assert wait_after_injection("straggler", 30) == 240
    assert wait_after_injection("gpu_lost", 30) == 90
    assert wait_after_injection("ib_congestion", 30) == wait_after_injection("host_mem_pressure", 30) == 240
    assert wait_after_injection("pcie_downgrade", 30) == 240
    assert wait_after_injection("ib_port_flap", 30) == wait_after_injection("ib_port_flap_nccl", 30) == 120
    assert wait_after_injection("row_remap_pending", 30) == 90


def test_torch_fault_markers_match_only_the_line_that_shows_the_fault() -> None:
    # Lines as torchrun --tee writes them to a node's log (see tests/fixtures/logs/torchrun_crash_rank1_real.txt).
    hang = TORCH_FAULTS["torch_hang"].pattern(3, 60)
    assert hang.search("[rank3]:injected fault: rank 3 stuck in data loading at step 60")
    assert not hang.search("[rank3]:step=59 loss=0.1000 grad_norm=1.0000 elapsed_ms=101.0")
    crash = TORCH_FAULTS["torch_crash"].pattern(1, 5)
    assert crash.search("[rank1]:[rank1]: RuntimeError: injected fault: rank 1 crashed at step 5")
    assert not crash.search("[rank1]:[rank1]: RuntimeError: injected fault: rank 11 crashed at step 5")
    slow = TORCH_FAULTS["torch_slow"].pattern(3, 60)  # the first slow step starts when step 59 is printed
    assert slow.search("[rank3]:step=59 loss=0.1000 grad_norm=1.0000 elapsed_ms=101.0")
    assert not slow.search("[rank3]:step=590 loss=0.1000 grad_norm=1.0000 elapsed_ms=101.0")
    assert not slow.search("[rank13]:step=59 loss=0.1000 grad_norm=1.0000 elapsed_ms=101.0")
    bug = TORCH_FAULTS["torch_user_bug"].pattern(None, 60)
    assert bug.search("[rank6]:[rank6]: RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x15 and 16x32)")


def test_scenario_selection() -> None:
    every, problems = parse_selection(None, torch=True)
    assert every == list(CATALOG) and not problems
    sim_only, _ = parse_selection("all", torch=False)
    assert "torch_hang" not in sim_only and "gpu_lost" in sim_only
    picked, problems = parse_selection("hang, gpu_lost,hang,bogus", torch=True)
    assert picked == ["hang", "gpu_lost"] and problems == ["unknown scenario 'bogus'"]
    _, problems = parse_selection("torch_hang", torch=False)
    assert problems == ["torch_hang needs torch, and --no-torch was given"]


class TestApi:
    def api(self, handler: Any) -> Api:
        return Api("http://api", "tok", transport=httpx.MockTransport(handler))

    def test_missing_route_is_a_clear_error(self) -> None:
        api = self.api(lambda request: httpx.Response(404, json={"detail": "Not Found"}))
        with pytest.raises(EndpointMissing, match=r"GET /api/v1/decisions answered 404: the API has no such endpoint"):
            api.decisions("job-1")

    def test_unknown_job_is_no_decisions(self) -> None:
        api = self.api(lambda request: httpx.Response(404, json={"error": "not_found", "message": "unknown job"}))
        assert api.decisions("job-1") == []

    def test_pages_are_followed_with_the_token_and_filter(self) -> None:
        seen: list[httpx.Request] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            if request.url.params.get("cursor") == "c2":
                return httpx.Response(200, json={"items": [decision("evict", "n2", 2)], "next_cursor": None})
            return httpx.Response(200, json={"items": [decision("evict", "n1", 1)], "next_cursor": "c2"})

        items = self.api(handler).decisions("job-1")
        assert [i["node"] for i in items] == ["n1", "n2"]
        assert all(r.headers["authorization"] == "Bearer tok" and r.url.params["job"] == "job-1" for r in seen)

    def test_incidents_are_read_one_by_one_with_their_findings(self) -> None:
        finding = {"id": 3, "detector": "peers", "confidence": 0.9, "node": "n1"}

        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/api/v1/incidents/7":
                return httpx.Response(
                    200, json=incident("infrastructure", ["n1"], incident_id=7) | {"findings": [finding]}
                )
            listed = {"id": 7, "blame": "infrastructure", "suspects": [], "findings": []}
            return httpx.Response(200, json={"items": [listed], "next_cursor": None})

        [got] = self.api(handler).incidents("job-1")
        assert got["suspects"][0]["node"] == "n1" and got["findings"] == [finding]

    def test_server_errors_and_refused_connections_say_what_failed(self) -> None:
        api = self.api(lambda request: httpx.Response(422, json={"error": "invalid", "message": "bad cursor"}))
        with pytest.raises(ApiError, match="answered 422: bad cursor"):
            api.decisions("job-1")

        def refuse(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("connection refused")

        with pytest.raises(ApiError, match="did not answer"):
            self.api(refuse).incidents("job-1")


def test_cli_rejects_bad_setups_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    from lab.evaluation.cli import main

    assert main(["--scenarios", "bogus", "--no-torch"]) == 2
    assert "unknown scenario 'bogus'" in capsys.readouterr().err
    assert main(["--scenarios", "gpu_lost", "--hang-timeout", "2"]) == 2
    assert main(["--scenarios", "straggler", "--nodes", "4", "--gpus-per-node", "4", "--tp", "8", "--pp", "4"]) == 2
    assert "--tp 8 x --pp 4 must divide the simulated world size (4 nodes x 4 GPUs = 16)" in capsys.readouterr().err
    assert main(["--list"]) == 0
    assert "torch_user_bug" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--parallel", "0"])


def test_the_sims_ground_truth_of_machine_level_faults_is_read_as_written() -> None:
    # host_mem_pressure: evicting the node is acceptable, not required; the others expect the eviction.
    for kind, expected, tolerated in (("host_mem_pressure", False, True), ("ib_congestion", True, False)):
        cluster = Cluster(SimConfig(nodes=3, gpus_per_node=2, scenario=kind, seed=5, fault_after=2))
        cluster.advance(3)
        gt = GroundTruth.from_json(json.loads(json.dumps(cluster.ground_truth())))
        (node,) = gt.faulty_nodes
        assert gt.expected_evictions == ({node} if expected else set())
        assert gt.tolerated_evictions == ({node} if tolerated else set())
        assert gt.blame == ("unknown" if tolerated else "infrastructure")
        assert CATALOG[kind].fault == kind and wait_after_injection(kind, 30) == 240


def test_diagnosing_healthy_machines_counts_as_false_accusations() -> None:
    """The 8x8 straggler's spray: every node sent to diagnostics before the right eviction. Evictions stay
    correct, but each healthy machine diagnosed is a false accusation, reported apart and held to 0.2 a fault."""
    sprayed = [decision("diagnose", n, 70) for n in NODES] + [decision("evict", "node-001", 100)]
    run = score_scenario(truth("straggler", "straggler", ["node-001"]), sprayed, [incident("infrastructure", NODES)])
    assert run.correct and run.false_accusations == ["node-000", "node-002", "node-003"] and run.faults == 1
    rejected = [decision("diagnose", "node-000", 70, state="rejected"), decision("evict", "node-001", 100)]
    clean = score_scenario(truth("straggler", "straggler", ["node-001"]), rejected, [])
    assert clean.false_accusations == []
    summary = summarize([run, clean])
    assert (summary.false_accusations, summary.faults) == (3, 2)
    [target] = [t for t in summary.targets if t.name.startswith("false accusations")]
    assert target.status == FAIL and target.detail.startswith("1.50")
    assert "diagnosed healthy node-000,node-002,node-003" in format_table([run])
    healthy = score_scenario(truth("healthy", None, []), [decision("diagnose", "node-002", 10)], [])
    [target] = [t for t in summarize([healthy]).targets if t.name.startswith("false accusations")]
    assert target.status == FAIL and "1 on runs without a fault" in target.detail


def test_several_seeds_are_summarized_per_scenario_with_their_spread() -> None:
    runs = [
        score_scenario(truth("gpu_lost", "gpu_lost", ["node-002"]), [decision("evict", "node-002", t)], [])
        for t in (1.0, 2.0, 6.0)
    ]
    runs.append(score_scenario(truth("healthy", None, []), [], []))
    [lost, healthy] = by_scenario(runs)
    assert (lost.scenario, lost.runs, lost.correct, lost.tp, lost.decided) == ("gpu_lost", 3, 3, 3, 3)
    assert (lost.median_s, lost.min_s, lost.max_s) == (2.0, 1.0, 6.0)
    assert lost.stdev_s == pytest.approx(2.6458, abs=1e-3)
    assert (healthy.runs, healthy.decided, healthy.median_s, healthy.stdev_s) == (1, 0, None, None)
    table = format_spread([lost, healthy]).splitlines()
    assert table[0].split()[:3] == ["scenario", "runs", "correct"]
    assert table[2].split() == ["gpu_lost", "3", "3/3", "3/0/0", "0", "2.0", "5.6", "1.0-6.0", "2.6"]


def test_calibration_judges_each_finding_against_the_ground_truth() -> None:
    def f(fid: int, detector: str, confidence: float, node: str | None, role: str = "cause") -> dict[str, Any]:
        return {"id": fid, "detector": detector, "confidence": confidence, "node": node, "role": role}

    lost = truth("gpu_lost", "gpu_lost", ["node-002"])
    incidents = [
        incident("infrastructure", ["node-002"]) | {"findings": [f(1, "signatures", 0.97, "node-002"),
                                                                 f(2, "peers", 0.55, "node-001"),
                                                                 f(3, "progress", 0.7, None),
                                                                 f(4, "signatures", 0.6, None, role="symptom")]},
        incident("infrastructure", ["node-002"], incident_id=2) | {"findings": [f(1, "signatures", 0.97, "node-002")]},
    ]  # fmt: skip
    judged = calibration.judge(lost, incidents)
    assert [(j.detector, j.right) for j in judged] == [("signatures", True), ("peers", False), ("progress", True)]
    healthy = calibration.judge(truth("healthy", None, []), [{"findings": [f(9, "progress", 0.7, None)]}])
    assert [j.right for j in healthy] == [False]  # any finding on a healthy run is wrong
    bins = {(b.detector, b.low): b for b in calibration.reliability(judged + healthy)}
    assert (bins[("progress", 0.7)].findings, bins[("progress", 0.7)].accuracy) == (2, 0.5)
    assert bins[("all", 0.9)].right == 1 and bins[("peers", 0.5)].accuracy == 0.0
    levels = calibration.thresholds(judged, {"diagnose": 0.5, "evict": 0.8})
    assert levels == [("diagnose", 0.5, 2, 0.5), ("evict", 0.8, 1, 1.0)]
    report = calibration.format_report(calibration.reliability(judged), levels)
    assert "policy evict threshold 0.80: 1 machine-naming findings at or above it, 100% right" in report


def test_a_node_slow_for_a_software_reason_must_be_diagnosed_not_evicted() -> None:
    slow = GroundTruth.from_json(
        {
            "scenario": "software_slow",
            "job_id": "job-sw",
            "nodes": NODES,
            "faults": [
                {"kind": "software_slow", "nodes": ["node-001"], "injected_at": T0.isoformat(), "blame": "user_code",
                 "expect_eviction": False, "expect_action": "diagnose"}
            ],
        }
    )  # fmt: skip
    assert slow.faults[0].expect_action == "diagnose" and slow.faults[0].to_json()["expect_action"] == "diagnose"
    diagnosed = score_scenario(slow, [decision("diagnose", "node-001", 60)], [])
    assert diagnosed.correct and diagnosed.false_accusations == []
    silent = score_scenario(slow, [], [])
    assert not silent.correct and silent.notes == ["no diagnose decision for node-001"]
    evicted = score_scenario(slow, [decision("evict", "node-001", 60), decision("diagnose", "node-001", 50)], [])
    assert not evicted.correct and evicted.fp == 1


def test_issue_17_scenarios_in_the_catalog_and_their_ground_truth() -> None:
    # Healthy runs with noise are watched like `healthy`: their ground truth has no fault (the transient is noise).
    for name in ("transient", "healthy_real"):
        assert CATALOG[name].fault is None and CATALOG[name].family == "sim"
        cluster = Cluster(SimConfig(nodes=3, gpus_per_node=2, scenario=name, seed=5, fault_after=2))
        cluster.advance(40)
        gt = GroundTruth.from_json(json.loads(json.dumps(cluster.ground_truth())))
        assert gt.healthy and gt.blame == "none" and not gt.expected_evictions
    assert wait_after_injection("two_faults", 30) == 180 + 90
    assert wait_after_injection("intermittent_straggler", 30) == 480
    assert wait_after_injection("hang_in_checkpoint", 30) == 35 + 30 + 60
    assert wait_after_injection("software_slow", 30) == wait_after_injection("fault_in_checkpoint", 30) + 150
    # Both faults of two_faults are to be evicted; software_slow's node is to be diagnosed, not evicted.
    cluster = Cluster(SimConfig(nodes=3, gpus_per_node=2, scenario="two_faults", seed=5, fault_after=2))
    cluster.advance(190)
    gt = GroundTruth.from_json(json.loads(json.dumps(cluster.ground_truth())))
    assert gt.kinds == {"straggler", "gpu_lost"} and len(gt.expected_evictions) == 2
    cluster = Cluster(SimConfig(nodes=3, gpus_per_node=2, scenario="software_slow", seed=5, fault_after=2))
    cluster.advance(3)
    raw = cluster.ground_truth()["faults"][0]
    gt = GroundTruth.from_json(raw | {"faults": [raw]})
    assert raw["expect_action"] == "diagnose" and not gt.expected_evictions and not gt.tolerated_evictions


def test_concurrent_faults_are_runs_whose_open_faults_overlap() -> None:
    def run(name: str, injected: str, took: float | None, ended: str) -> dict[str, Any]:
        day = "2026-11-26T10:"
        return {
            "score": {"scenario": name, "seed": 1, "time_to_decision_s": took},
            "ground_truth": {"faults": [{"injected_at": f"{day}{injected}+00:00"}] if injected else []},
            "ended_at": f"{day}{ended}+00:00",
        }

    runs = [
        run("gpu_lost", "00:30", 2.0, "01:00"),  # open 00:30-00:32
        run("straggler", "00:31", 90.0, "03:00"),  # open 00:31-02:01: overlaps both others
        run("hang", "01:40", None, "02:40"),  # never decided: open until its end
        run("healthy", "", None, "03:00"),  # no fault
        run("ecc_dbe", "05:00", 1.0, "05:30"),  # alone
    ]
    assert concurrent_faults(runs) == ["gpu_lost/s1", "straggler/s1", "hang/s1"]


def test_a_gpu_reset_fault_wants_a_reset_of_its_node_and_tolerates_an_eviction() -> None:
    gt = GroundTruth.from_json(
        {
            "scenario": "gpu_reset",
            "job_id": "job-gpu_reset",
            "nodes": NODES,
            "faults": [
                {"kind": "gpu_reset", "nodes": ["node-002"], "injected_at": T0.isoformat(), "blame": "infrastructure",
                 "expect_eviction": False, "eviction_optional": True, "expect_action": "reset_gpu"}
            ],
        }
    )  # fmt: skip
    reset = score_scenario(gt, [decision("reset_gpu", "node-002", 2)], [])
    assert reset.correct and reset.time_to_decision_s == 2 and (reset.tp, reset.fp, reset.fn) == (0, 0, 0)
    evicted = score_scenario(gt, [decision("evict", "node-002", 2)], [])
    assert not evicted.correct and evicted.fp == 0 and evicted.notes == ["no reset_gpu decision for node-002"]
    wrong_node = score_scenario(gt, [decision("reset_gpu", "node-001", 2)], [])
    assert not wrong_node.correct and wrong_node.notes == ["no reset_gpu decision for node-002"]
    assert wrong_node.false_accusations == ["node-001"]
