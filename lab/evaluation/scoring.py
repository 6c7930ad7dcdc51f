"""Scoring of `faultline eval`: ground truth, decisions and incidents in (lab/evaluation/records.py), per-scenario
scores and targets out.

Pure functions on plain data (the API's JSON and the sim's ground_truth.json), so they can be checked on
recorded data without a running service.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from lab.evaluation import spread
from lab.evaluation.records import (
    Decision,
    Fault,
    GroundTruth,
    Incident,
    ScenarioScore,
    parse_decisions,
    parse_incidents,
)
from lab.evaluation.scenarios import DOMAIN_FAULTS
from lab.evaluation.spread import percentile

# Decisions that settle what happens to the job (a `diagnose` may still be followed by an eviction).
CONCLUSIVE_KINDS = frozenset({"evict", "reset_gpu", "restart", "rollback", "none"})
FATAL_XID_KINDS = frozenset({"gpu_lost", "ecc_dbe", "fault_in_checkpoint", "gpu_reset"})
# Decisions stamped this much before the injection still count as answers to it (clock granularity).
CLOCK_SLACK_S = 2.0

TARGET_PRECISION = 0.97
TARGET_RECALL = 0.97
# Every fatal Xid within TARGET_XID_S (the earlier target), and their p95 within TARGET_XID_P95_S.
TARGET_XID_S = 10.0
TARGET_XID_P95_S = 5.0
TARGET_HANG_EXTRA_S = 30.0
TARGET_STRAGGLER_S = 180.0

PASS, FAIL, NA = "PASS", "FAIL", "n/a"


def evicted_nodes(decisions: Iterable[Decision]) -> set[str]:
    """Nodes with an eviction decision in any state but rejected."""
    return {d.node for d in decisions if d.evicts and d.node is not None}


def shared_cordons(decisions: Iterable[Decision]) -> dict[int, set[str]]:
    """Shared incident -> the machines its cordons cover (a whole NVLink domain's trays): decisions at the level of
    the component, which carry the shared incident and no incident of the job."""
    out: dict[int, set[str]] = {}
    for d in decisions:
        if d.shared_cordon and d.shared_incident_id is not None and d.node is not None:
            out.setdefault(d.shared_incident_id, set()).add(d.node)
    return out


def uncovered(faults: Iterable[Fault], cordons: Mapping[int, set[str]]) -> list[str]:
    """`no domain-level cordon covering NODES` for each shared component's fault (expect_action cordon) that no
    single shared incident's cordons cover whole."""
    notes = []
    for fault in faults:
        want = fault.covered
        if want and not any(want <= nodes for nodes in cordons.values()):
            best = max(cordons.values(), key=lambda nodes: len(want & nodes), default=set())
            notes.append(f"no domain-level cordon covering {', '.join(sorted(want - best))} ({fault.kind})")
    return notes


def healthy_members_accused(decisions: Iterable[Decision], truth: GroundTruth) -> set[str]:
    """Healthy members of a shared component's fault taken out one by one (an NVL72 tray evicted, diagnosed or reset
    for its switch tray's failure): the domain's fault, not theirs."""
    healthy = {n for f in truth.faults for n in f.members} - truth.faulty_nodes
    return {
        d.node
        for d in decisions
        if d.node in healthy and d.state != "rejected" and (d.evicts or d.kind in spread.ACCUSING_KINDS)
    }


def answering_decisions(decisions: Sequence[Decision], injected_at: datetime | None) -> list[Decision]:
    """The decisions made after the fault (within the clock slack), oldest first."""
    if injected_at is None:
        return []
    return [
        d
        for d in decisions
        if d.created_at is not None and (d.created_at - injected_at).total_seconds() >= -CLOCK_SLACK_S
    ]


def first_decision(decisions: Sequence[Decision]) -> Decision | None:
    """The first decision naming a node, or else the first decision at all."""
    named = [d for d in decisions if d.node is not None]
    return (named or list(decisions) or [None])[0]


def time_to_decision(decisions: Sequence[Decision], injected_at: datetime | None) -> float | None:
    """Seconds from the injection to the first decision naming a node (or the first at all)."""
    first = first_decision(answering_decisions(decisions, injected_at))
    if first is None or first.created_at is None or injected_at is None:
        return None
    return max(0.0, (first.created_at - injected_at).total_seconds())


def decided_blame(incidents: Sequence[Incident], decisions: Sequence[Decision]) -> str | None:
    """The blame of the incident behind the first decision (infrastructure for a shared component's cordon), else of
    the most confident incident."""
    first = first_decision(decisions)
    if first is not None and first.shared_cordon:
        return "infrastructure"  # a shared component failed (an NVLink domain's switch tray): the machines' side
    if not incidents:
        return None
    by_id = {i.id: i for i in incidents}
    if first is not None and first.incident_id in by_id:
        return by_id[first.incident_id].blame
    return max(incidents, key=lambda i: i.confidence).blame


def _blame_ok(expected: str, decided: str | None) -> bool | None:
    if expected == "none":
        return decided is None  # a healthy run should open no incident at all
    if expected in ("infrastructure", "user_code"):
        return decided == expected
    return None  # ambiguous by construction: not scored


def _suspects(incidents: Sequence[Incident]) -> list[str]:
    """Every suspect of every incident, the most confident first."""
    best: dict[str, float] = {}
    for incident in incidents:
        for node, confidence in incident.suspects:
            best[node] = max(confidence, best.get(node, -math.inf))
    return sorted(best, key=lambda n: (-best[n], n))


def score_scenario(
    truth: GroundTruth,
    decisions: Iterable[Mapping[str, Any]],
    incidents: Iterable[Mapping[str, Any]],
    *,
    seed: int | None = None,
    hang_timeout_s: float | None = None,
    error: str | None = None,
) -> ScenarioScore:
    """Score one run: detection, evictions against the faulty machines, blame and time to decision.

    A shared incident's cordons (an NVLink domain drained whole) are decisions at the domain's level: they answer a
    shared component's fault when they cover all its machines, and a faulty machine they cover counts as caught (a
    tray's own fault decided for its domain); a healthy member of such a fault evicted alone is a false accusation."""
    parsed = parse_decisions(decisions)
    found = parse_incidents(incidents)
    evicted = evicted_nodes(parsed)
    cordons = shared_cordons(parsed)
    covered = set().union(*cordons.values())
    expected, tolerated = truth.expected_evictions, truth.tolerated_evictions
    caught = evicted | covered
    tp, fp, fn = len(expected & caught), len(evicted - expected - tolerated), len(expected - caught)
    unanswered = spread.unanswered(truth.faults, parsed) + uncovered(truth.faults, cordons)
    injected = truth.injected_at
    answering = answering_decisions(parsed, injected)
    first = first_decision(answering)
    blame = decided_blame(found, parsed)
    early = len(parsed) - len(answering) if injected is not None else 0
    return ScenarioScore(
        scenario=truth.scenario,
        seed=seed,
        job_id=truth.job_id,
        kinds=sorted(truth.kinds),
        detected=bool(found) or any(d.kind != "none" for d in parsed),
        suspects=_suspects(found),
        evicted=sorted(evicted),
        expected=sorted(expected),
        tolerated=sorted(evicted & tolerated),
        tp=tp,
        fp=fp,
        fn=fn,
        correct=fp == 0 and fn == 0 and not unanswered,
        blame_expected=truth.blame,
        blame_decided=blame,
        blame_ok=_blame_ok(truth.blame, blame),
        time_to_decision_s=time_to_decision(parsed, injected),
        first_decision=(
            {"kind": first.kind, "node": first.node, "state": first.state, "confidence": first.confidence}
            if first is not None
            else None
        ),
        decisions=len(parsed),
        incidents=len(found),
        early_decisions=early,
        healthy=truth.healthy,
        user_code=truth.user_code,
        hang_timeout_s=hang_timeout_s,
        error=error,
        false_accusations=sorted(
            set(spread.false_accusations(parsed, truth.faulty_nodes)) | healthy_members_accused(parsed, truth)
        ),
        notes=unanswered,
        faults=len(truth.faults),
        domain_cordoned=sorted(covered),
        shared_incidents=len(cordons),
    )


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


@dataclass(frozen=True)
class Target:
    name: str
    status: str  # PASS | FAIL | n/a
    detail: str


@dataclass
class Summary:
    scenarios: int
    detected: int
    correct: int
    errors: int
    tp: int
    fp: int
    fn: int
    precision: float | None
    recall: float | None
    f1: float | None
    median_s: float | None
    p95_s: float | None
    false_accusations: int
    faults: int
    healthy_runs: int
    healthy_evictions: int
    user_code_runs: int
    user_code_evictions: int
    targets: list[Target]

    @property
    def passed(self) -> bool:
        return all(t.status != FAIL for t in self.targets)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def _at_least(name: str, value: float | None, bound: float, what: str) -> Target:
    if value is None:
        return Target(name, NA, f"no {what} to measure")
    return Target(name, PASS if value >= bound else FAIL, f"{value:.3f}")


def _time_target(name: str, runs: Sequence[ScenarioScore], limit: Callable[[ScenarioScore], float]) -> Target:
    """Every run of the kind decided within its limit (`limit(run)` seconds)."""
    if not runs:
        return Target(name, NA, "no such scenario run")
    late = []
    for run in runs:
        t, bound = run.time_to_decision_s, limit(run)
        if t is None or t > bound:
            late.append(f"{run.scenario}/s{run.seed}: " + ("no decision" if t is None else f"{t:.1f} s > {bound:g} s"))
    times = [r.time_to_decision_s for r in runs if r.time_to_decision_s is not None]
    worst = f", worst {max(times):.1f} s" if times else ""
    detail = f"{len(runs) - len(late)}/{len(runs)} in time{worst}" + (f" ({'; '.join(late)})" if late else "")
    return Target(name, FAIL if late else PASS, detail)


def _p95_target(name: str, runs: Sequence[ScenarioScore], bound: float) -> Target:
    """The runs' p95 time to decision within `bound`; a run without a decision fails it."""
    if not runs:
        return Target(name, NA, "no such scenario run")
    times = [r.time_to_decision_s for r in runs if r.time_to_decision_s is not None]
    undecided = len(runs) - len(times)
    p95 = spread.percentile(times, 95)
    detail = (f"p95 {p95:.1f} s" if p95 is not None else "no decision") + f" over {len(runs)} runs"
    if undecided:
        return Target(name, FAIL, f"{detail}, {undecided} without a decision")
    return Target(name, PASS if p95 is not None and p95 <= bound else FAIL, detail)


def _no_eviction_target(name: str, runs: Sequence[ScenarioScore]) -> Target:
    if not runs:
        return Target(name, NA, "no such scenario run")
    bad = [f"{r.scenario}/s{r.seed}: {', '.join(r.evicted)}" for r in runs if r.evicted]
    detail = f"{sum(len(r.evicted) for r in runs)} evictions over {len(runs)} runs"
    return Target(name, FAIL if bad else PASS, detail + (f" ({'; '.join(bad)})" if bad else ""))


def _false_accusation_target(scores: Sequence[ScenarioScore]) -> Target:
    name = f"false accusations <= {spread.TARGET_FALSE_ACCUSATIONS_PER_FAULT:g} per fault"
    faults = sum(s.faults for s in scores)
    accused = sum(len(s.false_accusations) for s in scores)
    if not faults:
        return Target(name, FAIL if accused else PASS, f"{accused} on runs without a fault")
    rate = accused / faults
    detail = f"{rate:.2f} ({accused} healthy machines diagnosed over {faults} faults)"
    return Target(name, PASS if rate <= spread.TARGET_FALSE_ACCUSATIONS_PER_FAULT else FAIL, detail)


def _domain_target(runs: Sequence[ScenarioScore]) -> Target:
    """Issue 43: an NVLink domain's fault decided at the domain's level (one shared incident cordoning its trays) or
    at the faulty tray's, no healthy tray evicted."""
    name = "NVLink domain faults: domain or tray level, no healthy tray evicted"
    if not runs:
        return Target(name, NA, "no such scenario run")
    bad = [
        f"{r.scenario}/s{r.seed}: " + "; ".join([*r.notes, *(f"evicted {n}" for n in r.evicted if n not in r.expected)])
        for r in runs
        if not r.correct or r.shared_incidents > 1
    ]
    detail = f"{len(runs) - len(bad)}/{len(runs)} right" + (f" ({' | '.join(bad)})" if bad else "")
    return Target(name, FAIL if bad else PASS, detail)


def targets(scores: Sequence[ScenarioScore], precision: float | None, recall: float | None) -> list[Target]:
    """The eval's targets, each PASS, FAIL or n/a (no scenario it applies to was run)."""

    def of_kind(*kinds: str) -> list[ScenarioScore]:
        # Runs of one fault: a run's time to decision counts from its first injection, which says nothing
        # about a second fault's (two_faults: a straggler, then an Xid three minutes later).
        return [s for s in scores if set(s.kinds) & set(kinds) and s.faults <= 1]

    def hang_limit(run: ScenarioScore) -> float:
        return (run.hang_timeout_s if run.hang_timeout_s is not None else math.inf) + TARGET_HANG_EXTRA_S

    return [
        _at_least(f"precision >= {TARGET_PRECISION}", precision, TARGET_PRECISION, "eviction"),
        _at_least(f"recall >= {TARGET_RECALL}", recall, TARGET_RECALL, "faulty machine"),
        _time_target(
            f"decision <= {TARGET_XID_S:g} s after a fatal Xid", of_kind(*FATAL_XID_KINDS), lambda _: TARGET_XID_S
        ),
        _p95_target(f"fatal Xid decided, p95 <= {TARGET_XID_P95_S:g} s", of_kind(*FATAL_XID_KINDS), TARGET_XID_P95_S),
        _time_target(
            f"hang decided within hang timeout + {TARGET_HANG_EXTRA_S:g} s",
            of_kind("hang", "hang_in_checkpoint"),
            hang_limit,
        ),
        _time_target(
            f"straggler decided <= {TARGET_STRAGGLER_S:g} s", of_kind("straggler"), lambda _: TARGET_STRAGGLER_S
        ),
        _false_accusation_target(scores),
        _no_eviction_target("no eviction on healthy runs", [s for s in scores if s.healthy]),
        _no_eviction_target("no eviction for user-code faults", [s for s in scores if s.user_code]),
        _domain_target(of_kind(*DOMAIN_FAULTS)),
    ]


def summarize(scores: Sequence[ScenarioScore], *, extra: Sequence[Target] = ()) -> Summary:
    """Machine-level precision, recall and F1 over all runs, decision times, and the targets."""
    tp, fp, fn = sum(s.tp for s in scores), sum(s.fp for s in scores), sum(s.fn for s in scores)
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall > 0
        else None
    )
    times = [s.time_to_decision_s for s in scores if s.time_to_decision_s is not None]
    healthy = [s for s in scores if s.healthy]
    user = [s for s in scores if s.user_code]
    return Summary(
        scenarios=len(scores),
        detected=sum(s.detected for s in scores),
        correct=sum(s.correct for s in scores),
        errors=sum(s.error is not None for s in scores),
        tp=tp,
        fp=fp,
        fn=fn,
        precision=precision,
        recall=recall,
        f1=f1,
        median_s=percentile(times, 50),
        p95_s=percentile(times, 95),
        false_accusations=sum(len(s.false_accusations) for s in scores),
        faults=sum(s.faults for s in scores),
        healthy_runs=len(healthy),
        healthy_evictions=sum(len(s.evicted) for s in healthy),
        user_code_runs=len(user),
        user_code_evictions=sum(len(s.evicted) for s in user),
        targets=[*targets(scores, precision, recall), *extra],
    )
