"""Scoring of `faultline eval` for NVLink-domain faults (issue 43): a whole domain's cordons (decided for its shared
incident, with no incident of the job) are decisions at the domain's level; a healthy tray evicted alone is a false
accusation. Hand-made decisions and ground truths shaped as the API and the sim's ground_truth.json give them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lab.evaluation.records import GroundTruth
from lab.evaluation.report import format_table
from lab.evaluation.runner import EvalConfig, Evaluation
from lab.evaluation.scenarios import DOMAIN_FAULTS
from lab.evaluation.scoring import FAIL, NA, PASS, score_scenario, summarize

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
TRAYS = [f"rack-a-tray{n:03d}" for n in range(4)]
DOMAIN = "a7a0cc3b-aaf5-0edf-181d-be072b02667d"


def switch_tray_failure() -> GroundTruth:
    """The sim's ground truth of nvswitch_tray_failure: no faulty tray, the domain's trays named apart."""
    fault = {
        "kind": "nvswitch_tray_failure",
        "nodes": [],
        "gpus": {},
        "ranks": [],
        "injected_at": T0.isoformat(),
        "blame": "infrastructure",
        "expect_eviction": False,
        "expect_action": "cordon",
        "switch_tray": "rack-a-switch3",
        "nvlink_domain": DOMAIN,
        "trays": TRAYS,
    }
    return GroundTruth.from_json(
        {"scenario": "nvswitch_tray_failure", "job_id": "job", "nodes": TRAYS, "faults": [fault]}
    )


def tray_nvlink(node: str) -> GroundTruth:
    """nvl72_tray_nvlink: one tray's own links, that tray to be taken out."""
    fault = {
        "kind": "nvl72_tray_nvlink",
        "nodes": [node],
        "gpus": {node: [2]},
        "ranks": [6],
        "injected_at": T0.isoformat(),
        "blame": "infrastructure",
        "expect_eviction": True,
        "expect_action": "evict",
        "nvlink_domain": DOMAIN,
    }
    return GroundTruth.from_json({"scenario": "nvl72_tray_nvlink", "job_id": "job", "nodes": TRAYS, "faults": [fault]})


_ids = iter(range(1, 10_000))


def decision(
    kind: str, node: str, after_s: float, *, shared: int | None = None, state: str = "pending"
) -> dict[str, Any]:
    """A decision as GET /api/v1/decisions lists it: a shared incident's cordon has no incident and no job."""
    return {
        "id": next(_ids),
        "incident_id": None if shared is not None else 1,
        "job_id": None if shared is not None else "job",
        "node": node,
        "kind": kind,
        "state": state,
        "confidence": 0.9,
        "reason": f"{kind} {node}",
        "evidence": {},
        "created_at": (T0 + timedelta(seconds=after_s)).isoformat().replace("+00:00", "Z"),
        "shared_incident_id": shared,
    }


def domain_cordons(after_s: float = 1.0, shared: int = 7, trays: list[str] = TRAYS) -> list[dict[str, Any]]:
    return [decision("cordon", t, after_s, shared=shared) for t in trays]


def test_a_switch_tray_failure_decided_for_its_domain_is_correct() -> None:
    score = score_scenario(switch_tray_failure(), domain_cordons(), [], seed=1)
    assert score.correct and score.detected
    assert (score.tp, score.fp, score.fn, score.evicted, score.false_accusations) == (0, 0, 0, [], [])
    assert (score.domain_cordoned, score.shared_incidents) == (TRAYS, 1)
    assert score.blame_decided == "infrastructure" and score.blame_ok  # a shared component's cordon: no job incident
    assert score.time_to_decision_s == 1.0 and score.first_decision is not None
    assert score.first_decision["kind"] == "cordon"
    table = format_table([score])
    assert "cordoned rack-a-tray000,rack-a-tray001,rack-a-tray002,rack-a-tray003 (1 shared incident)" in table


def test_a_switch_tray_failure_decided_tray_by_tray_is_wrong() -> None:
    """Per-node evictions of the domain's healthy trays: false positives and false accusations, and no domain-level
    decision at all."""
    decisions = [decision("evict", t, 2.0 + i) for i, t in enumerate(TRAYS)]
    score = score_scenario(switch_tray_failure(), decisions, [], seed=1)
    assert not score.correct
    assert (score.fp, score.evicted, score.false_accusations) == (4, TRAYS, TRAYS)
    assert score.notes == [f"no domain-level cordon covering {', '.join(TRAYS)} (nvswitch_tray_failure)"]


def test_a_domain_cordon_with_one_healthy_tray_also_evicted_is_wrong() -> None:
    decisions = [*domain_cordons(), decision("evict", TRAYS[2], 3.0)]
    score = score_scenario(switch_tray_failure(), decisions, [], seed=1)
    assert not score.correct
    assert (score.fp, score.false_accusations, score.notes) == (1, [TRAYS[2]], [])
    # A person rejected the eviction: nothing was taken out.
    decisions[-1]["state"] = "rejected"
    assert score_scenario(switch_tray_failure(), decisions, [], seed=1).correct


def test_a_cordon_that_misses_a_tray_or_is_not_the_domains_does_not_answer() -> None:
    partial = score_scenario(switch_tray_failure(), domain_cordons(trays=TRAYS[:3]), [], seed=1)
    assert not partial.correct and partial.notes == [
        f"no domain-level cordon covering {TRAYS[3]} (nvswitch_tray_failure)"
    ]
    # Two shared incidents, each with half the trays: no single domain-level decision covers the domain.
    split = [*domain_cordons(shared=1, trays=TRAYS[:2]), *domain_cordons(shared=2, trays=TRAYS[2:])]
    halves = score_scenario(switch_tray_failure(), split, [], seed=1)
    assert not halves.correct and halves.shared_incidents == 2
    # An operator's cordons (no shared incident) are no decision of the service's at the domain's level.
    by_hand = [decision("cordon", t, 1.0) for t in TRAYS]
    assert score_scenario(switch_tray_failure(), by_hand, [], seed=1).notes != []


def test_a_trays_own_fault_is_caught_at_tray_or_domain_level() -> None:
    faulty = TRAYS[1]
    evicted = score_scenario(tray_nvlink(faulty), [decision("evict", faulty, 16.0)], [], seed=1)
    assert evicted.correct and (evicted.tp, evicted.fp, evicted.fn) == (1, 0, 0)
    # Decided for the domain: the faulty tray is covered by the domain's cordons, which take it out of new work.
    drained = score_scenario(tray_nvlink(faulty), domain_cordons(), [], seed=1)
    assert drained.correct and (drained.tp, drained.fn, drained.evicted) == (1, 0, [])
    # Another tray evicted instead: a false positive, and the faulty one missed.
    wrong = score_scenario(tray_nvlink(faulty), [decision("evict", TRAYS[3], 16.0)], [], seed=1)
    assert not wrong.correct and (wrong.tp, wrong.fp, wrong.fn) == (0, 1, 1)


def test_the_domain_target_passes_only_when_every_domain_run_is_right() -> None:
    def target(scores: list[Any]) -> tuple[str, str]:
        (found,) = [t for t in summarize(scores).targets if t.name.startswith("NVLink domain faults")]
        return found.status, found.detail

    right = score_scenario(switch_tray_failure(), domain_cordons(), [], seed=1)
    tray = score_scenario(tray_nvlink(TRAYS[1]), [decision("evict", TRAYS[1], 16.0)], [], seed=1)
    assert target([right, tray]) == (PASS, "2/2 right")
    by_tray = score_scenario(switch_tray_failure(), [decision("evict", TRAYS[0], 2.0)], [], seed=2)
    status, detail = target([right, by_tray])
    assert status == FAIL and detail.startswith("1/2 right (nvswitch_tray_failure/s2: no domain-level cordon")
    assert "evicted rack-a-tray000" in detail
    assert target([])[0] == NA


def test_an_nvl72_scenario_runs_on_one_racks_trays_whatever_the_eval_asks(tmp_path: Path) -> None:
    """`--nodes 32 --gpus-per-node 8`: the NVL72 scenarios run 18 trays of 4 GPUs (one rack), the others as asked."""
    config = EvalConfig(scenarios=[], seeds=[1], data_dir=tmp_path, nodes=32, gpus_per_node=8)
    evaluation = Evaluation(
        config, api=None, url="http://127.0.0.1:1", agent_token="t", env={}, say=print, cancel=threading.Event()
    )
    sizes = {name: evaluation._new_run(name, 1, "job", "p", tmp_path).world_size for name in DOMAIN_FAULTS}
    assert sizes == {"nvswitch_tray_failure": 72, "nvl72_tray_nvlink": 72}
    assert evaluation._new_run("gpu_lost", 1, "job", "p", tmp_path).world_size == 256
