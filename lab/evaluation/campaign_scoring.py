"""Scoring of `faultline eval --campaign`: the faults a campaign injected, the decisions and incidents the service
made, the jobs' training progress in; per category recall and time to decision, the totals and the targets out.

Pure functions on plain data (what the harness recorded), so the figures can be checked by hand.

Definitions:
- A fault's window runs from its injection (less CLOCK_SLACK_S) to when it was dealt with (acted on, drained,
  restarted or, when nobody acted, repaired by hand) plus GRACE_S: a decision on the faulty machine a little
  after its eviction is a late echo, not an accusation.
- A node decision (evict, diagnose, reset_gpu, cordon) is a false accusation unless it falls in the window of a
  fault of its job on that very machine (a planned drain's machine is healthy: any decision on it is one).
- A fault is caught when its window holds the decision its kind expects on its machine (an eviction where the
  kind tolerates one); a fault with nothing to name (a user's bug, a planned drain) is caught when its window holds
  no node decision at all.
- Notifications on healthy jobs: the "opened" and "decided" events the service would send about incidents
  opened and decisions made outside every fault window, and its "node_before_gate" alerts (work placed on a node
  it held out of service, before the node's return gate) outside them, per job-day outside the windows.
- Manual interventions: decisions that waited for a person's approval, plus incidents left with blame unknown (not
  counting those merged away into another incident, which settled their blame).
- Stop-time checks (issue 28): a diagnose decision is resolved by its checks when the service concluded from them
  without a person: an eviction (or GPU reset) on a failing check, or the node's return on a clean pass, not left
  waiting for approval. A decision the checks made is judged at its diagnose decision's time (the checks take
  minutes after it), so an eviction by the checks of a faulty machine catches its fault and one of a healthy
  machine is a false accusation; besides, the totals count healthy nodes evicted by a check and faulty nodes
  (a fault of the machine itself on them) that reached diagnose but passed their checks. A diagnose decision that
  found its machine out of service already (in repair after an eviction: nothing to drain, no agent to answer) is
  moot: counted apart, in neither side of the share.
- Returns: a machine back from repair is reported back in service by the scheduler and its return gate (the
  level-1 checks) runs; the totals count the returns, the gates' outcomes (a repaired machine should pass; a
  failure makes an eviction, judged as any decision), the work placed before a gate (one chat alert each: none
  when the scheduler reports its returns) and the nodes still `returning` at the end, with or without a gate
  pending (without one, nothing will ever conclude them).
- Shared causes (issue 42): a component's fault (a leaf switch, a driver rollout, a storage outage, a rack's power)
  names its machines (`members`). It is caught when each member got a `cordon` in its window and none a per-node
  decision (evict, diagnose, reset_gpu): those are counted as per-node decisions for a shared cause, not as
  accusations of healthy machines; a decision in its window on any other machine is a false accusation. Each should
  open exactly one shared incident naming its component (`SharedIncidentRow`); a shared incident no such fault
  explains is a false one.
- ETTR: simulated seconds of training progress over elapsed seconds; its ideal adds back what each fault cost
  beyond the restart and the recomputation since the last checkpoint that acting at once would still cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lab.evaluation.scoring import FAIL, PASS
from lab.evaluation.spread import percentile

NODE_KINDS = frozenset({"evict", "diagnose", "reset_gpu", "cordon"})
CLOCK_SLACK_S = 2.0
GRACE_S = 60.0
STALE_AFTER_S = 300.0  # an incident still open this long after its fault was dealt with is stale

# Targets (issue 26).
MIN_FAULTS = 200
TARGET_RECALL = 0.97
TARGET_INCIDENTS_PER_FAULT = 1.1
TARGET_MANUAL_SHARE = 0.01
TARGET_NOTIFICATIONS_PER_JOB_DAY = 1.0
TARGET_RESOLVED_BY_CHECKS = 0.9  # issue 28
DAY_S = 86400.0


@dataclass(frozen=True)
class FaultOutcome:
    """One injected fault as the harness saw it (times in simulated seconds since the campaign's start)."""

    index: int
    job_id: str
    category: str
    kind: str
    node: str | None  # the faulty (or drained) machine; None for a job-wide fault
    gpu: int | None
    expect_action: str  # evict | reset_gpu | diagnose | none
    eviction_optional: bool
    localizable: bool
    injected_s: float
    dealt_s: float  # acted on, drained, restarted, or repaired by hand
    how: str  # acted | drained | restarted | by_hand
    stale_incidents: tuple[int, ...] = ()  # its job's incidents still open STALE_AFTER_S after dealt_s
    lost_s: float = 0.0  # training time the fault cost the job
    ideal_lost_s: float = 0.0  # what it would have cost had it been acted on at once
    # A shared component's fault: its machines, and the component as the service should name it.
    members: tuple[str, ...] = ()
    component_kind: str = ""
    component: str = ""

    @property
    def window(self) -> tuple[float, float]:
        return self.injected_s - CLOCK_SLACK_S, self.dealt_s + GRACE_S


@dataclass(frozen=True)
class DecisionRow:
    id: int
    job_id: str
    t_s: float
    kind: str
    node: str | None
    gpu: int | None = None
    awaited_approval: bool = False
    by_checks_of: int | None = None  # made by the stop-time checks of this diagnose decision


@dataclass(frozen=True)
class CheckRow:
    """One diagnose decision's stop-time checks, as the harness delivered them and the service concluded."""

    diagnose_decision: int
    job_id: str
    node: str
    t_s: float  # when the results were delivered
    outcome: str  # evict | reset_gpu | return | none (left to a person) | moot (the machine was out already)
    remedy_awaits_approval: bool  # the decision the checks made waits for a person
    faulty: bool  # the machine carried an infrastructure fault when it was checked
    fault_kinds: tuple[str, ...] = ()
    failed_checks: tuple[str, ...] = ()
    conclusion: str = ""

    @property
    def settled(self) -> bool:
        """Concluded without a person: evicted (or reset) on a failure, or returned on a clean pass."""
        if self.remedy_awaits_approval:
            return False
        return (self.outcome in ("evict", "reset_gpu") and bool(self.failed_checks)) or (
            self.outcome == "return" and not self.failed_checks
        )


@dataclass(frozen=True)
class GateRow:
    """One return gate's checks (a node the scheduler put back in service), as the harness delivered them and the
    service concluded."""

    job_id: str
    node: str
    t_s: float  # when the results were delivered (or the gate given up)
    how: str  # return_reported (the scheduler reported it back) | placed_before_gate (nobody did)
    outcome: str  # passed | failed | no_verdict | expired (its agent never answered)
    faulty: bool  # the machine carried an infrastructure fault when it was checked
    failed_checks: tuple[str, ...] = ()
    conclusion: str = ""


@dataclass(frozen=True)
class NodeNote:
    """A chat notification about a machine rather than an incident: work placed on it before its return gate."""

    job_id: str
    node: str
    t_s: float
    event: str = "node_before_gate"


@dataclass(frozen=True)
class NodeEnd:
    """A machine's state in the service when the campaign ended."""

    job_id: str
    node: str
    state: str
    gate_pending: bool  # a return gate's checks were asked for and not concluded


@dataclass(frozen=True)
class IncidentRow:
    id: int
    job_id: str
    first_seen_s: float
    blame: str
    silenced: bool = False
    root_cause: str = ""  # these three as the service had them at the campaign's end
    anchor: str = ""
    resolution: str | None = None  # None while open


@dataclass(frozen=True)
class SharedIncidentRow:
    """A shared-cause incident the service opened for machines of a job (issue 42)."""

    id: int
    job_id: str
    first_seen_s: float
    component_kind: str
    component: str
    members: tuple[str, ...] = ()
    superseded: bool = False  # resolved a pass later for a better explanation of the same findings


@dataclass(frozen=True)
class JobProgress:
    job_id: str
    elapsed_s: float
    productive_s: float  # steps gained times the job's healthy step time


@dataclass
class FaultVerdict:
    fault: FaultOutcome
    caught: bool
    decision_s: float | None  # time from injection to the expected decision
    wrong: list[int] = field(default_factory=list)  # decisions in its window that accused another machine
    per_node: list[int] = field(default_factory=list)  # a shared fault's: per-node decisions on its members


def _right(fault: FaultOutcome, d: DecisionRow) -> bool:
    """The decision the fault's kind expects, on its machine."""
    if d.node != fault.node or d.kind not in NODE_KINDS:
        return False
    want = fault.expect_action
    if d.kind == "evict":
        return want == "evict" or fault.eviction_optional
    if d.kind == "reset_gpu":
        return want == "reset_gpu" and (fault.gpu is None or d.gpu is None or d.gpu == fault.gpu)
    return d.kind == want == "diagnose"


def _in(window: tuple[float, float], t: float) -> bool:
    return window[0] <= t <= window[1]


def _judged_at(decisions: Sequence[DecisionRow]) -> dict[int, float]:
    """Decision id -> the time its window is read at: its own, or its diagnose decision's for one the checks made."""
    t = {d.id: d.t_s for d in decisions}
    return {d.id: t.get(d.by_checks_of, d.t_s) if d.by_checks_of is not None else d.t_s for d in decisions}


def judge(faults: Sequence[FaultOutcome], decisions: Sequence[DecisionRow]) -> tuple[list[FaultVerdict], list[int]]:
    """Each fault's verdict, and the ids of the decisions that accused a healthy machine."""
    verdicts = [FaultVerdict(f, caught=f.expect_action == "none", decision_s=None) for f in faults]
    accusations: list[int] = []
    at = _judged_at(decisions)
    cordoned: dict[int, set[str]] = {}  # a shared fault's index -> its members cordoned in its window
    for d in sorted(decisions, key=lambda d: (d.t_s, d.id)):
        if d.kind not in NODE_KINDS or d.node is None:
            continue
        mine = [v for v in verdicts if v.fault.job_id == d.job_id and _in(v.fault.window, at[d.id])]
        shared = next((v for v in mine if d.node in v.fault.members), None)
        if shared is not None:
            if d.kind == "cordon":
                cordoned.setdefault(shared.fault.index, set()).add(d.node)
                if cordoned[shared.fault.index] >= set(shared.fault.members) and shared.decision_s is None:
                    shared.decision_s = max(0.0, d.t_s - shared.fault.injected_s)
            else:
                shared.per_node.append(d.id)
            continue
        owner = next((v for v in mine if v.fault.node == d.node and v.fault.kind != "host_maintenance"), None)
        if owner is None:
            accusations.append(d.id)
            for v in mine:  # a fault's window that holds an accusation: for a fault with nothing to name, a miss
                v.wrong.append(d.id)
                if v.fault.expect_action == "none":
                    v.caught = False
            continue
        if owner.fault.expect_action == "none":
            owner.caught = False
        elif _right(owner.fault, d) and owner.decision_s is None:
            owner.caught = True
            owner.decision_s = max(0.0, d.t_s - owner.fault.injected_s)
    for v in verdicts:
        if v.fault.members:
            v.caught = cordoned.get(v.fault.index, set()) >= set(v.fault.members) and not v.per_node
    return verdicts, accusations


def shared_totals(
    faults: Sequence[FaultOutcome], decisions: Sequence[DecisionRow], shared: Sequence[SharedIncidentRow]
) -> dict[str, Any]:
    """Shared causes: how many incidents each opened (one expected), per-node decisions on their members (none
    expected), and shared incidents no shared fault explains."""
    verdicts, _ = judge(faults, decisions)
    mine = [v for v in verdicts if v.fault.members]
    per_fault: dict[int, list[int]] = {}
    explained: set[int] = set()
    for v in mine:
        f = v.fault
        hits = [
            s.id for s in shared
            if not s.superseded and s.job_id == f.job_id and _in(f.window, s.first_seen_s)
            and set(s.members) & set(f.members)
        ]  # fmt: skip
        per_fault[f.index] = hits
        explained.update(hits)
    named = sum(
        1 for v in mine if any(s.id in per_fault[v.fault.index] and s.component == v.fault.component for s in shared)
    )
    return {
        "shared_faults": len(mine),
        "shared_caught": sum(v.caught for v in mine),
        "shared_incidents": len(shared),
        "shared_superseded": sorted(s.id for s in shared if s.superseded),
        "shared_one_incident_each": sum(1 for v in mine if len(per_fault[v.fault.index]) == 1),
        "shared_component_named": named,
        "shared_per_node_decisions": sum(len(v.per_node) for v in mine),
        "shared_per_node_decision_ids": sorted(i for v in mine for i in v.per_node),
        "shared_false_incidents": sorted(s.id for s in shared if s.id not in explained and not s.superseded),
        "shared_by_fault": {
            str(v.fault.index): {
                "kind": v.fault.kind,
                "component": v.fault.component,
                "members": list(v.fault.members),
                "incidents": per_fault[v.fault.index],
                "cordoned": v.caught,
                "per_node_decisions": v.per_node,
            }
            for v in mine
        },
    }


def _ratio(n: float, d: float) -> float | None:
    return round(n / d, 4) if d else None


def _times(values: Iterable[float | None]) -> dict[str, float | None]:
    xs = [v for v in values if v is not None]
    median, p95 = percentile(xs, 50), percentile(xs, 95)
    return {
        "median_s": None if median is None else round(median, 1),
        "p95_s": None if p95 is None else round(p95, 1),
    }


def checks_totals(decisions: Sequence[DecisionRow], checks: Sequence[CheckRow]) -> dict[str, Any]:
    """How the diagnose decisions ended: settled by their stop-time checks, or left to a person."""
    moot = {c.diagnose_decision for c in checks if c.outcome == "moot"}
    diagnose = {d.id for d in decisions if d.kind == "diagnose"} - moot
    settled = {c.diagnose_decision for c in checks if c.settled} & diagnose
    return {
        "diagnose_decisions": len(diagnose),
        "diagnose_moot": len(moot),
        "diagnose_checked": len({c.diagnose_decision for c in checks if c.outcome != "moot"} & diagnose),
        "diagnose_resolved_by_checks": _ratio(len(settled), len(diagnose)),
        "checks_outcomes": dict(sorted(_count(c.outcome for c in checks).items())),
        "healthy_evicted_by_checks": sum(1 for c in checks if c.outcome in ("evict", "reset_gpu") and not c.faulty),
        "faulty_passed_checks": sum(1 for c in checks if c.outcome == "return" and c.faulty),
    }


def returns_totals(
    returns: int, refused: int, gates: Sequence[GateRow], notes: Sequence[NodeNote], ends: Sequence[NodeEnd]
) -> dict[str, Any]:
    """How machines came back into service: returns the scheduler reported, their gates' outcomes, work placed
    before a gate (each one chat notification), and nodes still `returning` at the end (with or without a gate)."""
    returning = [e for e in ends if e.state == "returning"]
    return {
        "returns_reported": returns,
        "returns_refused": refused,  # the service answered 409 (a take-out decision still waited): tried again
        "gates": len(gates),
        "gate_outcomes": dict(sorted(_count(g.outcome for g in gates).items())),
        "healthy_failed_gate": sum(1 for g in gates if g.outcome == "failed" and not g.faulty),
        "faulty_passed_gate": sum(1 for g in gates if g.outcome == "passed" and g.faulty),
        "node_before_gate_notifications": sum(1 for n in notes if n.event == "node_before_gate"),
        "returning_at_end": len(returning),
        "returning_without_gate": sum(1 for e in returning if not e.gate_pending),
    }


def score(
    faults: Sequence[FaultOutcome],
    decisions: Sequence[DecisionRow],
    incidents: Sequence[IncidentRow],
    jobs: Sequence[JobProgress],
    checks: Sequence[CheckRow] = (),
    notes: Sequence[NodeNote] = (),
    shared: Sequence[SharedIncidentRow] = (),
) -> dict[str, Any]:
    """The campaign's `categories` table, its `totals` and its `targets`."""
    verdicts, accusations = judge(faults, decisions)
    at = _judged_at(decisions)
    categories: list[dict[str, Any]] = []
    for name in dict.fromkeys(f.category for f in faults):
        mine = [v for v in verdicts if v.fault.category == name]
        categories.append(
            {
                "category": name,
                "localizable": mine[0].fault.localizable,
                "faults": len(mine),
                "caught": sum(v.caught for v in mine),
                "recall": _ratio(sum(v.caught for v in mine), len(mine)),
                **_times(v.decision_s for v in mine),
                "kinds": dict(sorted(_count(v.fault.kind for v in mine).items())),
            }
        )
    categories.sort(key=lambda c: -c["faults"])
    localizable = [v for v in verdicts if v.fault.localizable]

    def windowed(job_id: str, t: float) -> bool:
        return any(f.job_id == job_id and _in(f.window, t) for f in faults)

    noisy = sum(1 for i in incidents if not i.silenced and not windowed(i.job_id, i.first_seen_s))
    noisy += sum(1 for d in decisions if not windowed(d.job_id, at[d.id]))
    noisy += sum(1 for n in notes if not windowed(n.job_id, n.t_s))  # work placed on a node before its gate
    covered = sum(j.elapsed_s for j in jobs)
    in_windows = sum(min(f.window[1], _elapsed(jobs, f.job_id)) - max(0.0, f.window[0]) for f in faults)
    healthy_days = max(0.0, covered - in_windows) / DAY_S
    stale = sorted({i for f in faults for i in f.stale_incidents})
    # An incident merged away (a hang explained a pass later by a machine's fault) left its findings and blame to
    # the incident that took them: nobody has its blame to settle.
    unknown = sum(i.blame == "unknown" and not (i.resolution or "").startswith("merged") for i in incidents)
    manual = sum(d.awaited_approval for d in decisions) + unknown
    elapsed = sum(j.elapsed_s for j in jobs)
    productive = sum(j.productive_s for j in jobs)
    excess = sum(max(0.0, f.lost_s - f.ideal_lost_s) for f in faults)
    totals = {
        "faults": len(faults),
        "recall": _ratio(sum(v.caught for v in localizable), len(localizable)),
        "recall_all": _ratio(sum(v.caught for v in verdicts), len(verdicts)),
        **_times(v.decision_s for v in localizable),
        "false_accusations": len(accusations),
        "false_accusation_ids": accusations,
        "decisions": len(decisions),
        "incidents": len(incidents),
        "incidents_per_fault": _ratio(len(incidents), len(faults)),
        "stale_incidents": len(stale),
        "stale_incident_ids": stale,
        "manual_interventions": manual,
        "awaiting_approval": sum(d.awaited_approval for d in decisions),
        "unknown_blame_incidents": unknown,
        "notifications_on_healthy_jobs": noisy,
        "healthy_job_days": round(healthy_days, 4),
        "notifications_per_healthy_job_day": _ratio(noisy, healthy_days),
        "ettr": _ratio(productive, elapsed),
        "ettr_ideal": _ratio(min(elapsed, productive + excess), elapsed),
        "dealt_with": dict(sorted(_count(f.how for f in faults).items())),
        **checks_totals(decisions, checks),
        **shared_totals(faults, decisions, shared),
    }
    missed = [
        {**asdict(v.fault), "wrong_decisions": v.wrong}
        for v in verdicts
        if not v.caught
    ]  # fmt: skip
    return {"categories": categories, "totals": totals, "missed": missed, "targets": targets(totals)}


def _elapsed(jobs: Sequence[JobProgress], job_id: str) -> float:
    return next((j.elapsed_s for j in jobs if j.job_id == job_id), 0.0)


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def targets(totals: Mapping[str, Any]) -> list[dict[str, str]]:
    """Issue 26's campaign targets, each PASS or FAIL with the figure."""
    n = totals["faults"]
    recall = totals["recall"]
    per_fault = totals["incidents_per_fault"]
    per_day = totals["notifications_per_healthy_job_day"]

    def row(name: str, ok: bool, detail: str) -> dict[str, str]:
        return {"name": name, "status": PASS if ok else FAIL, "detail": detail}

    shared = []
    if totals.get("shared_faults") or totals.get("shared_false_incidents"):
        k = totals.get("shared_faults", 0)
        shared = [
            row(
                "one shared incident per shared cause, naming its component",
                totals["shared_one_incident_each"] == k and totals["shared_component_named"] == k,
                f"{totals['shared_one_incident_each']} of {k} shared causes with exactly one, "
                f"{totals['shared_component_named']} naming the component; "
                f"{len(totals['shared_false_incidents'])} shared incidents no shared cause explains",
            ),
            row(
                "no per-node eviction for a shared cause",
                totals["shared_per_node_decisions"] == 0,
                f"{totals['shared_per_node_decisions']} per-node decisions on their members",
            ),
        ]
    return [
        *shared,
        row(f"at least {MIN_FAULTS} faults", n >= MIN_FAULTS, f"{n} faults"),
        row(
            f"recall >= {TARGET_RECALL} over the localizable categories",
            recall is not None and recall >= TARGET_RECALL,
            f"{recall}",
        ),
        row(
            "0 decisions on healthy nodes", totals["false_accusations"] == 0, f"{totals['false_accusations']} decisions"
        ),
        row(
            f"<= {TARGET_INCIDENTS_PER_FAULT} incidents per fault",
            per_fault is not None and per_fault <= TARGET_INCIDENTS_PER_FAULT,
            f"{per_fault} ({totals['incidents']} incidents)",
        ),
        row(
            f"0 incidents open {STALE_AFTER_S / 60:.0f} min after their fault was dealt with",
            totals["stale_incidents"] == 0,
            f"{totals['stale_incidents']} incidents",
        ),
        row(
            f"manual interventions <= {TARGET_MANUAL_SHARE:.0%} of faults",
            totals["manual_interventions"] <= TARGET_MANUAL_SHARE * n,
            f"{totals['manual_interventions']} ({totals['awaiting_approval']} awaiting approval, "
            f"{totals['unknown_blame_incidents']} incidents of unknown blame)",
        ),
        row(
            f">= {TARGET_RESOLVED_BY_CHECKS:.0%} of diagnose decisions resolved by their checks, no person",
            totals.get("diagnose_resolved_by_checks") is None
            or totals["diagnose_resolved_by_checks"] >= TARGET_RESOLVED_BY_CHECKS,
            f"{totals.get('diagnose_resolved_by_checks')} of {totals.get('diagnose_decisions', 0)} diagnose decisions",
        ),
        row(
            "0 healthy nodes evicted by a check",
            not totals.get("healthy_evicted_by_checks"),
            f"{totals.get('healthy_evicted_by_checks', 0)} nodes",
        ),
        row(
            "every faulty node that reached diagnose caught by its checks",
            not totals.get("faulty_passed_checks"),
            f"{totals.get('faulty_passed_checks', 0)} faulty nodes passed",
        ),
        row(
            f"<= {TARGET_NOTIFICATIONS_PER_JOB_DAY:g} notification per healthy job-day",
            per_day is None or per_day <= TARGET_NOTIFICATIONS_PER_JOB_DAY,
            f"{per_day} ({totals['notifications_on_healthy_jobs']} over {totals['healthy_job_days']} job-days)",
        ),
    ]


def format_table(result: Mapping[str, Any]) -> str:
    """The categories table, the totals and the targets, as the CLI prints them."""

    def s(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) and v <= 1.0 else str(v)

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = [f"{'category':<24} {'faults':>6} {'caught':>6} {'recall':>7} {'median s':>9} {'p95 s':>7}  kinds"]
    for c in result["categories"]:
        mark = "" if c["localizable"] else " *"
        kinds = ", ".join(f"{k} {v}" for k, v in c["kinds"].items())
        lines.append(
            f"{c['category'] + mark:<24} {c['faults']:>6} {c['caught']:>6} {s(c['recall']):>7} "
            f"{secs(c['median_s']):>9} {secs(c['p95_s']):>7}  {kinds}"
        )
    t = result["totals"]
    lines += [
        "(* nothing to name: caught when no machine is accused)",
        "",
        f"faults {t['faults']}; recall over the localizable categories {s(t['recall'])} (all {s(t['recall_all'])}); "
        f"time to decision median {secs(t['median_s'])} s, p95 {secs(t['p95_s'])} s",
        f"false accusations {t['false_accusations']}; incidents {t['incidents']} ({s(t['incidents_per_fault'])} per "
        f"fault); stale incidents {t['stale_incidents']}; manual interventions {t['manual_interventions']}",
        f"notifications on healthy jobs {t['notifications_on_healthy_jobs']} over {t['healthy_job_days']} job-days "
        f"({s(t['notifications_per_healthy_job_day'])} per job-day); ETTR {s(t['ettr'])} (ideal with the same faults "
        f"{s(t['ettr_ideal'])}); dealt with: {', '.join(f'{k} {v}' for k, v in t['dealt_with'].items())}",
        f"diagnose decisions {t.get('diagnose_decisions', 0)} (and {t.get('diagnose_moot', 0)} moot), checked "
        f"{t.get('diagnose_checked', 0)}, resolved by their checks {s(t.get('diagnose_resolved_by_checks'))} "
        f"(target >= {TARGET_RESOLVED_BY_CHECKS:.0%}); checks concluded: "
        f"{', '.join(f'{k} {v}' for k, v in t.get('checks_outcomes', {}).items()) or 'none'}; "
        f"healthy nodes evicted by a check {t.get('healthy_evicted_by_checks', 0)}; faulty nodes passed "
        f"{t.get('faulty_passed_checks', 0)}",
        f"returns reported {t.get('returns_reported', 0)}; return gates {t.get('gates', 0)} ("
        f"{', '.join(f'{k} {v}' for k, v in t.get('gate_outcomes', {}).items()) or 'none'}; healthy failed "
        f"{t.get('healthy_failed_gate', 0)}, faulty passed {t.get('faulty_passed_gate', 0)}); work placed before its "
        f"gate (node_before_gate notifications) {t.get('node_before_gate_notifications', 0)}; nodes returning at the "
        f"end {t.get('returning_at_end', 0)} ({t.get('returning_without_gate', 0)} without a gate pending)",
    ]
    if t.get("shared_faults") or t.get("shared_incidents"):
        lines.append(
            f"shared causes {t['shared_faults']}: cordoned whole {t['shared_caught']}; shared incidents "
            f"{t['shared_incidents']} (exactly one for {t['shared_one_incident_each']}, the component named for "
            f"{t['shared_component_named']}, {len(t['shared_false_incidents'])} no shared cause explains, "
            f"{len(t.get('shared_superseded', []))} rivals superseded a pass later {t.get('shared_superseded', [])}); "
            f"per-node decisions on their members {t['shared_per_node_decisions']}"
        )
        for index, s in t["shared_by_fault"].items():
            lines.append(
                f"  #{index} {s['kind']} {s['component']} ({len(s['members'])} nodes): incidents {s['incidents']}, "
                f"cordoned {'yes' if s['cordoned'] else 'no'}, per-node decisions {s['per_node_decisions'] or 'none'}"
            )
    if result["missed"]:
        lines += ["", "missed:"]
        for m in result["missed"]:
            lines.append(
                f"  #{m['index']} {m['kind']} on {m['node'] or 'the job'} at t={m['injected_s']:.0f}s "
                f"(expected {m['expect_action']}; dealt with: {m['how']})"
                + (f"; wrong decisions {m['wrong_decisions']}" if m["wrong_decisions"] else "")
            )
    lines += ["", "targets:"]
    lines += [f"  {r['status']:<4}  {r['name']}: {r['detail']}" for r in result["targets"]]
    return "\n".join(lines)
