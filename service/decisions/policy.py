"""The policy: an incident proposal in, decisions out, through configurable guard rails.

Pure: the service gathers the context (recent evictions, cooldowns, network flaps) and persists the plans.
Every plan records which guard rails it passed or tripped, so a person can see why it was (not) acted on.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ml.demarcation import IncidentProposal, Suspect
from ml.ladder import History
from service.config import Settings
from service.decisions import ladder
from service.gpu_names import bus_id, kernel_pci


@dataclass(frozen=True, slots=True)
class PolicyContext:
    now: datetime
    job_nodes: int  # how many nodes the job runs on (blast radius denominator)
    evicted_last_hour: int  # evict decisions for this job's nodes in the last hour (not rejected)
    nodes_in_cooldown: Collection[str]  # nodes with an eviction decision within the cooldown
    job_in_cooldown: Collection[str]  # job-level kinds (restart, rollback) decided within the cooldown
    network_events: Mapping[str, Sequence[datetime]]  # node -> times of network-fault occurrences
    already_decided: Collection[tuple[str, str | None]]  # (kind, node) this incident already has
    # (node, GPU PCI address as Xid lines name it) -> the GPU's index, from the agents' inventory.
    gpu_indexes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # (node, GPU PCI address as Xid lines name it) -> times of its reset_gpu decisions within the reset window,
    # other incidents' included: by address, as a suspect names its GPU, whether a reset named it by index or not.
    gpu_resets: Mapping[tuple[str, str], Sequence[datetime]] = field(default_factory=dict)
    # node -> why: machines a person cleared on the same kind of evidence as they are accused on now (rejects.py).
    overruled: Mapping[str, str] = field(default_factory=dict)
    # Nodes whose network adapter itself failed (a fatal async event, its driver's fatal error): not a flap, so no
    # flap tolerance.
    network_fatal: Collection[str] = frozenset()
    # node -> its lone flap that broke the job's connections (service/decisions/service.py `lone_broken_flaps`): one
    # is enough.
    network_broken: Mapping[str, datetime] = field(default_factory=dict)
    # node -> its remedies and faults: the escalation ladder's history (service/nodes/ladder.py).
    ladders: Mapping[str, History] = field(default_factory=dict)


# Decisions in these states did not (and will not) act: they count for neither cooldowns nor blast radius.
INACTIVE = ("rejected", "expired", "failed", "shadow")


@dataclass(frozen=True, slots=True)
class PriorDecision:
    """A decision already made, as the guard rails see it (stored, or one a backtest just made)."""

    kind: str
    node: str | None
    state: str
    created_at: datetime
    job_id: int | None
    incident_id: int | None


def build_context(
    *,
    now: datetime,
    job_id: int,
    incident_id: int,
    job_nodes: int,
    prior: Iterable[PriorDecision],
    network_events: Mapping[str, Sequence[datetime]],
    already_decided: Collection[tuple[str, str | None]],
    settings: Settings,
    gpu_indexes: Mapping[tuple[str, str], int] | None = None,
    gpu_resets: Mapping[tuple[str, str], Sequence[datetime]] | None = None,
    overruled: Mapping[str, str] | None = None,
    network_fatal: Collection[str] = frozenset(),
    network_broken: Mapping[str, datetime] | None = None,
    ladders: Mapping[str, History] | None = None,
) -> PolicyContext:
    """The guard rails' view of the past: blast radius, cooldowns; shared by the live path and the backtest."""
    active = [d for d in prior if d.state not in INACTIVE]
    hour_ago = now - timedelta(hours=1)
    node_since = now - timedelta(seconds=settings.policy_node_cooldown_s)
    job_since = now - timedelta(seconds=settings.policy_job_cooldown_s)
    # Decisions outside any incident (an operator's) count for neither cooldown, as in SQL's `incident_id <> x`.
    other = [d for d in active if d.incident_id is not None and d.incident_id != incident_id]
    return PolicyContext(
        now=now,
        job_nodes=job_nodes,
        evicted_last_hour=len(
            {d.node for d in active if d.kind == "evict" and d.job_id == job_id and d.node and d.created_at >= hour_ago}
        ),
        nodes_in_cooldown={d.node for d in other if d.kind == "evict" and d.node and d.created_at >= node_since},
        job_in_cooldown={d.kind for d in other if d.job_id == job_id and d.node is None and d.created_at >= job_since},
        network_events=network_events,
        already_decided=already_decided,
        gpu_indexes=gpu_indexes or {},
        gpu_resets=gpu_resets or {},
        overruled=overruled or {},
        network_fatal=network_fatal,
        network_broken=network_broken or {},
        ladders=ladders or {},
    )


def prior_window(settings: Settings) -> timedelta:
    """How far back build_context looks."""
    return timedelta(seconds=max(3600.0, settings.policy_node_cooldown_s, settings.policy_job_cooldown_s))


@dataclass(slots=True)
class DecisionPlan:
    kind: str
    node: str | None
    state: str
    confidence: float
    reason: str
    finding_ids: list[int]
    guard_rails: dict[str, str] = field(default_factory=dict)
    gpu: int | None = None  # the GPU index, for reset_gpu
    gpu_pci: str | None = None  # for reset_gpu, its PCI bus id ("0000:3b:00.0") when the index is unknown
    ladder: dict[str, Any] | None = None  # its rung on the escalation ladder, and why (service/decisions/ladder.py)


@dataclass(frozen=True, slots=True)
class Skipped:
    """Why the policy decided nothing (new) for a node, or for the job (node None): the guard rail and its words."""

    node: str | None
    rail: str
    why: str


def decide(
    proposal: IncidentProposal, ctx: PolicyContext, settings: Settings, skipped: list[Skipped] | None = None
) -> list[DecisionPlan]:
    """Decisions for one incident; empty when nothing new should be done.

    `skipped`, when given, collects why each suspect (and the job) got no new decision: the backtest explains
    differences with it."""
    notes: list[Skipped] = [] if skipped is None else skipped
    plans: list[DecisionPlan] = []
    budget = _evict_budget(ctx, settings)
    for suspect in proposal.suspects:
        plan = _for_suspect(proposal, suspect, ctx, settings, budget, notes)
        if plan is None:
            continue
        ladder.escalate(
            plan,
            suspect_reason=suspect.reason,
            root_cause=proposal.root_cause,
            history=ctx.ladders.get(suspect.node, History()),
            now=ctx.now,
            settings=settings,
            budget=budget,
            job_nodes=ctx.job_nodes,
            evicted_last_hour=ctx.evicted_last_hour,
        )
        if (plan.kind, plan.node) in ctx.already_decided:
            notes.append(Skipped(plan.node, "already_decided", f"{plan.kind} {plan.node} already decided"))
            continue
        if plan.kind == "evict" and plan.state != "awaiting_approval":
            budget -= 1
        plans.append(plan)
    if not proposal.suspects or proposal.blame == "user_code":
        job_plan = _for_job(proposal, ctx, settings, notes)
        if job_plan is not None and (job_plan.kind, None) not in ctx.already_decided:
            plans.append(job_plan)
        elif job_plan is not None:
            notes.append(Skipped(None, "already_decided", f"{job_plan.kind} already decided"))
    return [_apply_mode(plan, settings) for plan in plans]


def _evict_budget(ctx: PolicyContext, settings: Settings) -> int:
    allowed = max(1, math.floor(settings.policy_max_evict_share_per_hour * max(ctx.job_nodes, 1)))
    return allowed - ctx.evicted_last_hour


def _for_suspect(
    proposal: IncidentProposal,
    suspect: Suspect,
    ctx: PolicyContext,
    settings: Settings,
    budget: int,
    notes: list[Skipped],
) -> DecisionPlan | None:
    rails: dict[str, str] = {}
    ids = list(suspect.finding_ids)
    node = suspect.node
    if proposal.blame == "user_code":
        return _skip(notes, node, "blame", "user code: a user's bug never costs a machine")
    if node in ctx.overruled:
        # A person said this evidence does not condemn the machine; only different evidence reopens the question.
        return _skip(notes, node, "rejected", ctx.overruled[node])
    if suspect.action == "evict" and suspect.confidence >= settings.policy_evict_min_confidence:
        rails["confidence"] = _compared(suspect.confidence, ">=", settings.policy_evict_min_confidence)
        if proposal.root_cause == "network" and node in ctx.network_fatal:
            rails["flap_tolerance"] = "the network adapter itself failed (its fatal error): not a flap"
        elif proposal.root_cause == "network":
            times = _recent(ctx.network_events.get(suspect.node, ()), ctx.now, settings.policy_network_flap_window_s)
            needed = settings.policy_network_flap_count
            counted = f"{len(times)} network faults in {settings.policy_network_flap_window_s:.0f} s"
            broken = ctx.network_broken.get(node)
            if len(times) >= needed:
                rails["flap_tolerance"] = counted
            elif broken is not None:
                rails["flap_tolerance"] = (
                    f"{counted}, but the flap at {broken:%H:%M:%S} broke the job's connections (IB completion errors) "
                    f"and no other machine's link dropped within {settings.policy_network_broken_flap_s:.0f} s of it"
                )
            else:
                # One flap the job rode through is not a broken link; wait for the next within the window.
                return _skip(notes, node, "flap_tolerance", f"{counted}, {needed} needed")
        if suspect.node in ctx.nodes_in_cooldown:
            # Evicted recently already: the scheduler is acting on it.
            return _skip(notes, node, "cooldown", f"evicted within {settings.policy_node_cooldown_s:.0f} s")
        reset = _reset_gpu(suspect, ctx, settings, rails)
        if reset is not None:
            return reset
        reason = f"evict {suspect.node}: {suspect.reason}"
        if "gpu_reset" in rails:
            reason = f"evict {suspect.node}: {rails['gpu_reset']}; {suspect.reason}"
        if budget <= 0:
            rails["blast_radius"] = (
                f"over the limit of {settings.policy_max_evict_share_per_hour:.0%} of {ctx.job_nodes} nodes per hour"
            )
            return DecisionPlan("evict", suspect.node, "awaiting_approval", suspect.confidence, reason, ids, rails)
        rails["blast_radius"] = f"{ctx.evicted_last_hour} evicted in the last hour, within the limit"
        return DecisionPlan("evict", suspect.node, "pending", suspect.confidence, reason, ids, rails)
    if suspect.action in ("evict", "diagnose") and suspect.confidence >= settings.policy_diagnose_min_confidence:
        rails["confidence"] = (
            _compared(suspect.confidence, "below the eviction threshold", settings.policy_evict_min_confidence)
            if suspect.action == "evict"
            else _compared(suspect.confidence, ">=", settings.policy_diagnose_min_confidence)
        )
        if suspect.node in ctx.nodes_in_cooldown:
            return _skip(notes, node, "cooldown", f"evicted within {settings.policy_node_cooldown_s:.0f} s")
        reason = f"run diagnostics on {suspect.node}: {suspect.reason}"
        return DecisionPlan("diagnose", suspect.node, "pending", suspect.confidence, reason, ids, rails)
    if suspect.action not in ("evict", "diagnose"):
        return _skip(notes, node, "action", f"its findings ask for {suspect.action}")
    return _skip(
        notes,
        node,
        "confidence",
        _compared(suspect.confidence, "below the diagnose threshold", settings.policy_diagnose_min_confidence),
    )


def _reset_gpu(suspect: Suspect, ctx: PolicyContext, settings: Settings, rails: dict[str, str]) -> DecisionPlan | None:
    """reset_gpu when the catalog says resetting the suspect's one faulty GPU is enough and the GPU has not been
    reset too often lately; otherwise None (evict), with the reason in `rails["gpu_reset"]` when it escalates.

    The GPU is named by its index when the node's inventory knows it, else by its PCI bus id (a node without
    NVML, a kernel-log-only agent): `nvidia-smi -r -i` takes either, so the lack of an inventory costs no node."""
    if not settings.policy_reset_gpu_enabled or suspect.reset_gpu is None:
        return None
    address = kernel_pci(suspect.reset_gpu)
    gpu = ctx.gpu_indexes.get((suspect.node, address or ""))
    pci = bus_id(address) if gpu is None else None
    if gpu is None and pci is None:
        # Neither an index nor an address a scheduler could pass on: take the node out instead.
        rails["gpu_reset"] = f"GPU {suspect.reset_gpu} is neither in {suspect.node}'s GPU inventory nor a PCI address"
        return None
    name = f"GPU {gpu}" if gpu is not None else f"GPU {pci}"
    window = settings.policy_reset_gpu_window_s
    earlier = _recent(ctx.gpu_resets.get((suspect.node, address or ""), ()), ctx.now, window)
    limit = settings.policy_reset_gpu_max_per_window
    if len(earlier) >= limit:
        rails["gpu_reset"] = (
            f"{name} was already reset {len(earlier)} time{'s' if len(earlier) > 1 else ''} in the last "
            f"{_duration(window)} (at most {limit}): escalated to evicting the node"
        )
        return None
    rails["gpu_reset"] = f"{len(earlier)} earlier reset(s) of {name} in the last {_duration(window)} (at most {limit})"
    target = f"{name} on {suspect.node}"
    if pci is not None:
        rails["gpu_address"] = f"not in {suspect.node}'s GPU inventory: addressed by PCI bus id"
        target += " (not in its GPU inventory: addressed by PCI bus id)"
    reason = f"reset {target}: {suspect.reason}"
    # A reset keeps the node in the job: it counts against no eviction budget.
    return DecisionPlan(
        "reset_gpu", suspect.node, "pending", suspect.confidence, reason, list(suspect.finding_ids), rails, gpu, pci
    )


def _compared(confidence: float, relation: str, threshold: float) -> str:
    """ "62% below the eviction threshold 90%": confidences as whole percentages, as every page shows them; with a
    decimal where whole ones would read alike (79.5% below 80%, not 80% below 80%)."""
    digits = 0 if round(confidence * 100) != round(threshold * 100) or confidence == threshold else 1
    return f"{confidence * 100:.{digits}f}% {relation} {threshold * 100:.{digits}f}%"


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"


_JOB_ACTIONS = {"rollback": "policy_rollback_min_confidence", "restart": "policy_restart_min_confidence"}


def _for_job(
    proposal: IncidentProposal, ctx: PolicyContext, settings: Settings, notes: list[Skipped]
) -> DecisionPlan | None:
    kind = proposal.job_action
    if kind not in _JOB_ACTIONS:
        return None  # diagnose at job level means "dump stacks", which the service does itself
    threshold = getattr(settings, _JOB_ACTIONS[kind])
    if proposal.confidence < threshold:
        why = f"{kind}: {_compared(proposal.confidence, 'below the threshold', threshold)}"
        return _skip(notes, None, "confidence", why)
    if kind in ctx.job_in_cooldown:
        return _skip(notes, None, "cooldown", f"{kind} decided within {settings.policy_job_cooldown_s:.0f} s")
    why = {
        "rollback": "the failure is in the job's own code or data: roll back to the last good code or checkpoint",
        "restart": "no machine is to blame: restart the job",
    }[kind]
    rails = {"confidence": _compared(proposal.confidence, ">=", threshold), "blame": proposal.blame}
    return DecisionPlan(
        kind, None, "pending", proposal.confidence, f"{why} ({proposal.summary})", list(proposal.finding_ids), rails
    )


def _skip(notes: list[Skipped], node: str | None, rail: str, why: str) -> None:
    notes.append(Skipped(node, rail, why))
    return None


def _apply_mode(plan: DecisionPlan, settings: Settings) -> DecisionPlan:
    if settings.policy_mode == "shadow":
        plan.state = "shadow"
        plan.guard_rails["mode"] = "shadow: recorded, never acted on"
    elif plan.state == "pending" and (
        settings.policy_mode == "approval" or plan.kind in settings.policy_approval_required_for
    ):
        plan.state = "awaiting_approval"
        plan.guard_rails["mode"] = "approval required"
    return plan


def _recent(times: Sequence[datetime], now: datetime, window_s: float) -> list[datetime]:
    since = now - timedelta(seconds=window_s)
    return sorted(t for t in times if t >= since)
