"""`faultline eval --campaign`'s scoring on hand-made records: every figure worked out by hand."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict

from lab.evaluation.campaign_report import scored
from lab.evaluation.campaign_scoring import (
    CheckRow,
    DecisionRow,
    FaultOutcome,
    GateRow,
    IncidentRow,
    JobProgress,
    NodeEnd,
    NodeNote,
    SharedIncidentRow,
    checks_totals,
    format_table,
    judge,
    returns_totals,
    score,
)
from lab.sim.mix import CATEGORY_OF, LLAMA3_405B, LOCALIZABLE, draw, spec_of
from lab.sim.scenarios import FAULT_KINDS


def _fault(index: int, kind: str, node: str | None, t: float, dealt: float, **kw: object) -> FaultOutcome:
    k = FAULT_KINDS[kind]
    args: dict[str, object] = {
        "index": index,
        "job_id": "j",
        "category": CATEGORY_OF[kind],
        "kind": kind,
        "node": node,
        "gpu": 1 if k.scope == "gpu" else None,
        "expect_action": k.action,
        "eviction_optional": k.eviction_optional,
        "localizable": CATEGORY_OF[kind] in LOCALIZABLE,
        "injected_s": t,
        "dealt_s": dealt,
        "how": "acted",
    }
    args.update(kw)
    return FaultOutcome(**args)  # type: ignore[arg-type]


FAULTS = [
    _fault(0, "gpu_lost", "n1", 100.0, 130.0),  # evicted at 110: caught in 10 s
    _fault(1, "gsp_error", "n2", 1000.0, 1020.0),  # reset_gpu on its GPU at 1005: caught in 5 s
    _fault(2, "user_bug", None, 2000.0, 2100.0, how="restarted"),  # diagnose on n3 at 2010: missed, an accusation
    _fault(3, "straggler", "n0", 3000.0, 3400.0, how="by_hand"),  # nothing decided: missed
    _fault(4, "host_maintenance", "n1", 4000.0, 4030.0, how="drained"),  # nothing decided: caught
    _fault(5, "sdc", "n2", 5000.0, 5100.0),  # evicted (tolerated) at 5040: caught in 40 s
]
DECISIONS = [
    DecisionRow(1, "j", 110.0, "evict", "n1"),
    DecisionRow(2, "j", 175.0, "evict", "n1"),  # a late echo within the grace period: no accusation
    DecisionRow(3, "j", 1005.0, "reset_gpu", "n2", gpu=1),
    DecisionRow(4, "j", 2010.0, "diagnose", "n3", awaited_approval=True),
    DecisionRow(5, "j", 2012.0, "restart", None),  # job-level: nobody accused
    DecisionRow(6, "j", 5040.0, "evict", "n2"),
    DecisionRow(7, "j", 6000.0, "evict", "n0"),  # a healthy stretch: an accusation
]
INCIDENTS = [
    IncidentRow(1, "j", 110.0, "infrastructure"),
    IncidentRow(2, "j", 1004.0, "infrastructure"),
    IncidentRow(3, "j", 2005.0, "user_code"),
    IncidentRow(4, "j", 2006.0, "unknown"),
    IncidentRow(5, "j", 5030.0, "infrastructure"),
    IncidentRow(6, "j", 6000.0, "unknown"),  # outside every window: a notification on a healthy job
    IncidentRow(7, "j", 7000.0, "infrastructure", silenced=True),  # silenced: no notification
    # A hang merged a pass later into the machine fault that explained it: its blame is that incident's.
    IncidentRow(8, "j", 1005.0, "unknown", root_cause="hang", resolution="merged: its findings belong to another"),
]


def test_each_fault_is_judged_by_what_its_kind_expects_on_its_machine() -> None:
    verdicts, accusations = judge(FAULTS, DECISIONS)
    assert [v.caught for v in verdicts] == [True, True, False, False, True, True]
    assert [v.decision_s for v in verdicts] == [10.0, 5.0, None, None, None, 40.0]
    assert accusations == [4, 7]
    assert verdicts[2].wrong == [4]


def test_a_decision_on_a_drained_node_accuses_it_and_misses_the_drain() -> None:
    drain = _fault(0, "host_maintenance", "n1", 100.0, 130.0, how="drained")
    verdicts, accusations = judge([drain], [DecisionRow(1, "j", 120.0, "evict", "n1")])
    assert accusations == [1] and not verdicts[0].caught


def test_an_eviction_is_not_a_gpu_reset_and_a_reset_of_another_gpu_misses() -> None:
    ecc = _fault(0, "ecc_dbe", "n1", 100.0, 130.0)
    gsp = _fault(1, "gpu_reset", "n2", 1000.0, 1030.0)  # eviction optional: an eviction is caught too
    verdicts, _ = judge([ecc, gsp], [DecisionRow(1, "j", 105.0, "reset_gpu", "n1", gpu=1)])
    assert [v.caught for v in verdicts] == [False, False]
    verdicts, _ = judge([gsp], [DecisionRow(1, "j", 1005.0, "reset_gpu", "n2", gpu=3)])
    assert not verdicts[0].caught
    verdicts, _ = judge([gsp], [DecisionRow(1, "j", 1005.0, "evict", "n2")])
    assert verdicts[0].caught


def test_totals_and_targets_from_hand_computed_figures() -> None:
    faults = [
        *FAULTS[:5],
        _fault(5, "sdc", "n2", 5000.0, 5100.0, stale_incidents=(5,), lost_s=900.0, ideal_lost_s=300.0),
    ]
    jobs = [JobProgress("j", elapsed_s=86400.0, productive_s=77760.0)]
    result = score(faults, DECISIONS, INCIDENTS, jobs)
    t = result["totals"]
    # localizable: gpu_lost, gsp_error, straggler, sdc -> 3 of 4; all six: 4 of 6
    assert t["faults"] == 6 and t["recall"] == 0.75 and t["recall_all"] == round(4 / 6, 4)
    assert (t["median_s"], t["p95_s"]) == (10.0, 37.0)  # 5, 10, 40: p95 = 10 + 0.9 * 30
    assert t["false_accusations"] == 2 and t["false_accusation_ids"] == [4, 7]
    assert t["incidents"] == 8 and t["incidents_per_fault"] == round(8 / 6, 4)
    assert t["stale_incidents"] == 1 and t["stale_incident_ids"] == [5]
    # Decision 4 awaited approval; incidents 4 and 6 have unknown blame (8 was merged away).
    assert t["manual_interventions"] == 3 and t["unknown_blame_incidents"] == 2
    # Outside every window: decision 7 and incident 6 (incident 7 is silenced).
    assert t["notifications_on_healthy_jobs"] == 2
    # Each window: from 2 s before the injection to 60 s after it was dealt with.
    windows = (30 + 62) + (20 + 62) + (100 + 62) + (400 + 62) + (30 + 62) + (100 + 62)
    assert t["healthy_job_days"] == round((86400 - windows) / 86400, 4)
    assert t["notifications_per_healthy_job_day"] == round(2 / ((86400 - windows) / 86400), 4)
    assert t["ettr"] == 0.9 and t["ettr_ideal"] == round((77760 + 600) / 86400, 4)
    assert t["dealt_with"] == {"acted": 3, "by_hand": 1, "drained": 1, "restarted": 1}
    status = {r["name"]: r["status"] for r in result["targets"]}
    # 6 faults, recall 0.75, 2 accusations, 1.33 incidents per fault, 1 stale, 3 manual, 2.02 per job-day; the one
    # diagnose decision (4) waited for a person and was never checked: 0 of 1 resolved by checks.
    checks = {n for n in status if "check" in n}
    assert {status[n] for n in status if n not in checks} == {"FAIL"} and len(status) == 10
    assert t["diagnose_decisions"] == 1 and t["diagnose_resolved_by_checks"] == 0.0
    assert {n: status[n] for n in checks} == {
        ">= 90% of diagnose decisions resolved by their checks, no person": "FAIL",
        "0 healthy nodes evicted by a check": "PASS",
        "every faulty node that reached diagnose caught by its checks": "PASS",
    }
    by_category = {c["category"]: c for c in result["categories"]}
    assert by_category["software_bug"]["recall"] == 0.0 and not by_category["software_bug"]["localizable"]
    assert by_category["faulty_gpu"]["median_s"] == 10.0
    assert {m["index"] for m in result["missed"]} == {2, 3}


def test_a_clean_campaign_passes_every_target() -> None:
    faults = [_fault(i, "gpu_lost", "n1", 1000.0 * i, 1000.0 * i + 30) for i in range(200)]
    decisions = [DecisionRow(i, "j", 1000.0 * i + 8, "evict", "n1") for i in range(200)]
    incidents = [IncidentRow(i, "j", 1000.0 * i + 8, "infrastructure") for i in range(200)]
    result = score(faults, decisions, incidents, [JobProgress("j", 200_000.0, 190_000.0)])
    assert all(r["status"] == "PASS" for r in result["targets"]), result["targets"]
    assert result["totals"]["recall"] == 1.0 and result["totals"]["median_s"] == 8.0


def test_the_mix_draws_categories_by_their_share_and_nodes_uniformly() -> None:
    rng = random.Random(5)
    draws = [draw(rng, nodes=4, gpus_per_node=8) for _ in range(20000)]
    shares = {c.name: c.share for c in LLAMA3_405B}
    total = sum(shares.values())
    by_category = Counter(d.category for d in draws)
    for name, share in shares.items():
        assert abs(by_category[name] / len(draws) - share / total) < 0.01, name
    by_node = Counter(d.node for d in draws)
    assert set(by_node) == {0, 1, 2, 3} and max(by_node.values()) / min(by_node.values()) < 1.1
    for d in draws[:500]:
        spec = spec_of(d, 10.0)
        scope = FAULT_KINDS[d.kind].scope
        assert (spec.node is None) == (scope == "job") and (spec.gpu is None) == (scope != "gpu")
    assert all(kind in FAULT_KINDS for kind in CATEGORY_OF)
    # The same seed, the same draws.
    again = random.Random(5)
    assert [draw(again, nodes=4, gpus_per_node=8) for _ in range(50)] == draws[:50]


def _check(
    diagnose: int, node: str, outcome: str, *, faulty: bool, failed: tuple[str, ...] = (), **kw: object
) -> CheckRow:
    return CheckRow(diagnose, "j", node, 0.0, outcome, False, faulty, failed_checks=failed, **kw)  # type: ignore[arg-type]


def test_diagnose_decisions_resolved_by_their_checks_and_the_checks_mistakes() -> None:
    decisions = [
        DecisionRow(1, "j", 100.0, "diagnose", "n1"),  # checks failed: evicted (11)
        DecisionRow(2, "j", 200.0, "diagnose", "n2"),  # checks passed: returned
        DecisionRow(3, "j", 300.0, "diagnose", "n3"),  # checks failed, the eviction waits for approval
        DecisionRow(4, "j", 400.0, "diagnose", "n0"),  # never checked (the machine's agent was down)
        DecisionRow(5, "j", 500.0, "diagnose", "n1"),  # checks refused: left to a person
        DecisionRow(6, "j", 600.0, "diagnose", "n2"),  # healthy, yet a check failed: reset
        DecisionRow(7, "j", 700.0, "diagnose", "n3"),  # faulty, but every check passed: returned
        DecisionRow(8, "j", 800.0, "diagnose", "n1"),  # the machine was in repair already: moot
        DecisionRow(11, "j", 220.0, "evict", "n1", by_checks_of=1),
    ]
    checks = [
        _check(1, "n1", "evict", faulty=True, failed=("gemm_bf16",)),
        _check(2, "n2", "return", faulty=False),
        CheckRow(3, "j", "n3", 0.0, "evict", True, True, failed_checks=("nvml_state",)),
        _check(5, "n1", "none", faulty=False),
        _check(6, "n2", "reset_gpu", faulty=False, failed=("nvml_state",)),
        _check(7, "n3", "return", faulty=True),
        _check(8, "n1", "moot", faulty=False),
    ]
    t = checks_totals(decisions, checks)
    # Settled without a person: 1 (evict on fail), 2 (return on pass), 6 and 7 (wrongly, but without a person).
    assert t["diagnose_decisions"] == 7 and t["diagnose_moot"] == 1 and t["diagnose_checked"] == 6
    assert t["diagnose_resolved_by_checks"] == round(4 / 7, 4)
    assert t["checks_outcomes"] == {"evict": 2, "moot": 1, "none": 1, "reset_gpu": 1, "return": 2}
    assert t["healthy_evicted_by_checks"] == 1 and t["faulty_passed_checks"] == 1


def test_a_checks_eviction_is_judged_at_its_diagnose_decision_and_catches_the_fault() -> None:
    # A straggler: diagnose at 110, the node out for its checks at 115 (dealt with), evicted by them at 240, past
    # the 60 s grace: judged at 110 it is the fault's eviction, not an accusation, and the fault is caught.
    straggler = _fault(0, "straggler", "n1", 100.0, 115.0)
    decisions = [
        DecisionRow(1, "j", 110.0, "diagnose", "n1"),
        DecisionRow(2, "j", 240.0, "evict", "n1", by_checks_of=1),
    ]
    verdicts, accusations = judge([straggler], decisions)
    assert accusations == [] and verdicts[0].caught and verdicts[0].decision_s == 140.0
    # The same eviction without its link to the diagnose decision is a late accusation.
    _, accusations = judge([straggler], [decisions[0], DecisionRow(2, "j", 240.0, "evict", "n1")])
    assert accusations == [2]
    result = score(
        [straggler],
        decisions,
        [],
        [JobProgress("j", 1000.0, 900.0)],
        [_check(1, "n1", "evict", faulty=True, failed=("nvml_state", "gemm_bf16"))],
    )
    assert (
        result["totals"]["diagnose_resolved_by_checks"] == 1.0
        and result["totals"]["notifications_on_healthy_jobs"] == 0
    )
    table = format_table(result)
    assert "resolved by their checks 1.000 (target >= 90%)" in table and "checks concluded: evict 1" in table


def test_a_decision_on_the_fault_a_stopped_run_was_going_through_accuses_nobody() -> None:
    """Ctrl-C stopped a 200-fault run 3 min into a runaway loader on n3; the diagnose on n3 that came first was
    counted as a decision on a healthy machine. It answers the unfinished fault; one on another machine still
    accuses."""
    report = {
        "jobs": [{"job_id": "j", "unfinished_at": {"node": "n3", "injected_s": 7000.0}}],
        "faults": [asdict(f) for f in FAULTS],
        "decisions": [
            asdict(d)
            for d in [
                *DECISIONS,
                DecisionRow(8, "j", 7170.0, "diagnose", "n3"),
                DecisionRow(9, "j", 7175.0, "evict", "n1"),
            ]
        ],
        "incidents": [],
        "progress": [],
    }
    totals = scored(report)["totals"]
    assert totals["false_accusation_ids"] == [4, 7, 9]


def test_returns_their_gates_and_work_placed_before_a_gate_are_counted() -> None:
    """Three machines came back from repair: two reported back (one gate passed, one failed on a healthy machine),
    one had work placed on it before its gate (a chat alert, outside every fault window: a notification on a
    healthy job); one node is still `returning` with no gate waiting, one with its gate still running."""
    gates = [
        GateRow("j", "n1", 500.0, "return_reported", "passed", faulty=False),
        GateRow("j", "n2", 900.0, "return_reported", "failed", faulty=False, failed_checks=("pressure",)),
        GateRow("j", "n3", 6500.0, "placed_before_gate", "passed", faulty=True),
    ]
    notes = [NodeNote("j", "n3", 6490.0)]
    ends = [
        NodeEnd("j", "n0", "healthy", False),
        NodeEnd("j", "n1", "returning", True),
        NodeEnd("j", "n3", "returning", False),
    ]
    t = returns_totals(2, 1, gates, notes, ends)
    assert t == {
        "returns_reported": 2,
        "returns_refused": 1,
        "gates": 3,
        "gate_outcomes": {"failed": 1, "passed": 2},
        "healthy_failed_gate": 1,
        "faulty_passed_gate": 1,
        "node_before_gate_notifications": 1,
        "returning_at_end": 2,
        "returning_without_gate": 1,
    }
    jobs = [JobProgress("j", elapsed_s=86400.0, productive_s=77760.0)]
    quiet = score(FAULTS, DECISIONS, INCIDENTS, jobs)["totals"]["notifications_on_healthy_jobs"]
    noisy = score(FAULTS, DECISIONS, INCIDENTS, jobs, notes=notes)["totals"]["notifications_on_healthy_jobs"]
    assert noisy == quiet + 1
    # In a fault's window (gpu_lost on n1, 98-190 s) it is no healthy job's notification; still counted apart.
    inside = [NodeNote("j", "n3", 150.0)]
    assert score(FAULTS, DECISIONS, INCIDENTS, jobs, notes=inside)["totals"]["notifications_on_healthy_jobs"] == quiet
    report = {
        "jobs": [{"job_id": "j"}],
        "faults": [asdict(f) for f in FAULTS],
        "decisions": [asdict(d) for d in DECISIONS],
        "incidents": [asdict(i) for i in INCIDENTS],
        "progress": [asdict(j) for j in jobs],
        "returns": [{"job_id": "j", "node": "n1", "t_s": 490.0, "was": "evicted"}],
        "gates": [asdict(g) for g in gates],
        "node_ends": [asdict(e) for e in ends],
        "node_notes": [asdict(n) for n in notes],
    }
    result = scored(report)
    assert result["totals"]["node_before_gate_notifications"] == 1
    assert result["totals"]["notifications_on_healthy_jobs"] == quiet + 1
    table = format_table(result)
    assert "work placed before its gate (node_before_gate notifications) 1" in table
    assert "nodes returning at the end 2 (1 without a gate pending)" in table


def test_a_shared_cause_is_caught_by_its_members_cordons_and_scored_for_its_incidents() -> None:
    members = ("n1", "n2", "n3")
    switch = _fault(
        0, "switch_down", None, 100.0, 200.0, members=members, component_kind="switch", component="leaf-0",
        localizable=True,
    )  # fmt: skip
    driver = _fault(
        1, "driver_rollout", None, 1000.0, 1100.0, members=members, component_kind="driver", component="570.86.10",
        localizable=True,
    )  # fmt: skip
    lone = _fault(2, "gpu_lost", "n4", 2000.0, 2030.0)
    decisions = [
        *(DecisionRow(10 + k, "j", 105.0, "cordon", n) for k, n in enumerate(members)),
        *(DecisionRow(20 + k, "j", 1005.0, "cordon", n) for k, n in enumerate(members)),
        DecisionRow(30, "j", 1004.0, "evict", "n2"),  # a per-node eviction for the driver: a miss, no accusation
        DecisionRow(31, "j", 1006.0, "evict", "n9"),  # a machine outside the component: an accusation
        DecisionRow(40, "j", 2010.0, "evict", "n4"),
    ]
    shared = [
        SharedIncidentRow(1, "j", 104.0, "switch", "leaf-0", members),
        SharedIncidentRow(2, "j", 1004.0, "driver", "570.86.10", members),
        SharedIncidentRow(3, "j", 1004.5, "rack", "rack-0", members),  # a second one for the same fault
        SharedIncidentRow(4, "j", 5000.0, "switch", "leaf-3", ("n7", "n8", "n9")),  # no shared fault explains it
    ]
    verdicts, accusations = judge([switch, driver, lone], decisions)
    assert [v.caught for v in verdicts] == [True, False, True]
    assert verdicts[0].decision_s == 5.0 and verdicts[1].per_node == [30]
    assert accusations == [31]
    result = score([switch, driver, lone], decisions, [], [JobProgress("j", 9000.0, 8000.0)], shared=shared)
    t = result["totals"]
    assert (t["shared_faults"], t["shared_caught"], t["shared_incidents"]) == (2, 1, 4)
    assert (t["shared_one_incident_each"], t["shared_component_named"]) == (1, 2)
    assert (t["shared_per_node_decisions"], t["shared_false_incidents"]) == (1, [4])
    targets = {r["name"]: r["status"] for r in result["targets"]}
    assert targets["one shared incident per shared cause, naming its component"] == "FAIL"
    assert targets["no per-node eviction for a shared cause"] == "FAIL"
    table = format_table(result)
    assert "shared causes 2: cordoned whole 1" in table and "#1 driver_rollout 570.86.10 (3 nodes)" in table


def test_a_rival_superseded_a_pass_later_is_no_second_incident_of_its_fault() -> None:
    members = ("n1", "n2", "n3")
    driver = _fault(
        0, "driver_rollout", None, 1000.0, 1100.0, members=members, component_kind="driver", component="570.86.10",
        localizable=True,
    )  # fmt: skip
    decisions = [DecisionRow(20 + k, "j", 1005.0, "cordon", n) for k, n in enumerate(members)]
    shared = [
        SharedIncidentRow(1, "j", 1003.0, "power_domain", "pdu-0", members[:2], superseded=True),
        SharedIncidentRow(2, "j", 1004.0, "driver", "570.86.10", members),
    ]
    t = score([driver], decisions, [], [JobProgress("j", 9000.0, 8000.0)], shared=shared)["totals"]
    assert (t["shared_one_incident_each"], t["shared_component_named"], t["shared_false_incidents"]) == (1, 1, [])
    assert t["shared_superseded"] == [1] and t["shared_by_fault"]["0"]["incidents"] == [2]
