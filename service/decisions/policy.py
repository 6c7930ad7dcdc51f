"""The policy: an incident proposal in, decisions out, through configurable guard rails.

Pure: the service gathers the context (recent evictions, cooldowns, network flaps) and persists the plans.
Every plan records which guard rails it passed or tripped, so a person can see why it was (not) acted on.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ml.demarcation import IncidentProposal, Suspect
from service.config import Settings


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
    # (node, GPU index) -> times of its reset_gpu decisions within the reset window, other incidents' included.
    gpu_resets: Mapping[tuple[str, int], Sequence[datetime]] = field(default_factory=dict)


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


def decide(proposal: IncidentProposal, ctx: PolicyContext, settings: Settings) -> list[DecisionPlan]:
    """Decisions for one incident; empty when nothing new should be done."""
    plans: list[DecisionPlan] = []
    budget = _evict_budget(ctx, settings)
    for suspect in proposal.suspects:
        plan = _for_suspect(proposal, suspect, ctx, settings, budget)
        if plan is None or (plan.kind, plan.node) in ctx.already_decided:
            continue
        if plan.kind == "evict" and plan.state != "awaiting_approval":
            budget -= 1
        plans.append(plan)
    if not proposal.suspects or proposal.blame == "user_code":
        job_plan = _for_job(proposal, ctx, settings)
        if job_plan is not None and (job_plan.kind, None) not in ctx.already_decided:
            plans.append(job_plan)
    return [_apply_mode(plan, settings) for plan in plans]


def _evict_budget(ctx: PolicyContext, settings: Settings) -> int:
    allowed = max(1, math.floor(settings.policy_max_evict_share_per_hour * max(ctx.job_nodes, 1)))
    return allowed - ctx.evicted_last_hour


def _for_suspect(
    proposal: IncidentProposal, suspect: Suspect, ctx: PolicyContext, settings: Settings, budget: int
) -> DecisionPlan | None:
    rails: dict[str, str] = {}
    ids = list(suspect.finding_ids)
    if proposal.blame == "user_code":
        return None  # a user's bug never costs a machine
    if suspect.action == "evict" and suspect.confidence >= settings.policy_evict_min_confidence:
        rails["confidence"] = f"{suspect.confidence:.2f} >= {settings.policy_evict_min_confidence:.2f}"
        if proposal.root_cause == "network":
            times = _recent(ctx.network_events.get(suspect.node, ()), ctx.now, settings.policy_network_flap_window_s)
            needed = settings.policy_network_flap_count
            if len(times) < needed:
                return None  # one flap is not a broken link; wait for the next within the window
            rails["flap_tolerance"] = f"{len(times)} network faults in {settings.policy_network_flap_window_s:.0f} s"
        if suspect.node in ctx.nodes_in_cooldown:
            return None  # evicted recently already: the scheduler is acting on it
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
            f"{suspect.confidence:.2f} below the eviction threshold {settings.policy_evict_min_confidence:.2f}"
            if suspect.action == "evict"
            else f"{suspect.confidence:.2f} >= {settings.policy_diagnose_min_confidence:.2f}"
        )
        if suspect.node in ctx.nodes_in_cooldown:
            return None
        reason = f"run diagnostics on {suspect.node}: {suspect.reason}"
        return DecisionPlan("diagnose", suspect.node, "pending", suspect.confidence, reason, ids, rails)
    return None


def _reset_gpu(suspect: Suspect, ctx: PolicyContext, settings: Settings, rails: dict[str, str]) -> DecisionPlan | None:
    """reset_gpu when the catalog says resetting the suspect's one faulty GPU is enough and the GPU has not been
    reset too often lately; otherwise None (evict), with the reason in `rails["gpu_reset"]` when it escalates."""
    if not settings.policy_reset_gpu_enabled or suspect.reset_gpu is None:
        return None
    gpu = ctx.gpu_indexes.get((suspect.node, suspect.reset_gpu))
    if gpu is None:
        # Without the index no scheduler can tell which GPU to reset: take the node out instead.
        rails["gpu_reset"] = f"GPU {suspect.reset_gpu} is not in {suspect.node}'s GPU inventory"
        return None
    window = settings.policy_reset_gpu_window_s
    earlier = _recent(ctx.gpu_resets.get((suspect.node, gpu), ()), ctx.now, window)
    limit = settings.policy_reset_gpu_max_per_window
    if len(earlier) >= limit:
        rails["gpu_reset"] = (
            f"GPU {gpu} was already reset {len(earlier)} time{'s' if len(earlier) > 1 else ''} in the last "
            f"{_duration(window)} (at most {limit}): escalated to evicting the node"
        )
        return None
    rails["gpu_reset"] = (
        f"{len(earlier)} earlier reset(s) of GPU {gpu} in the last {_duration(window)} (at most {limit})"
    )
    reason = f"reset GPU {gpu} on {suspect.node}: {suspect.reason}"
    # A reset keeps the node in the job: it counts against no eviction budget.
    return DecisionPlan(
        "reset_gpu", suspect.node, "pending", suspect.confidence, reason, list(suspect.finding_ids), rails, gpu
    )


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"


_JOB_ACTIONS = {"rollback": "policy_rollback_min_confidence", "restart": "policy_restart_min_confidence"}


def _for_job(proposal: IncidentProposal, ctx: PolicyContext, settings: Settings) -> DecisionPlan | None:
    kind = proposal.job_action
    if kind not in _JOB_ACTIONS:
        return None  # diagnose at job level means "dump stacks", which the service does itself
    threshold = getattr(settings, _JOB_ACTIONS[kind])
    if proposal.confidence < threshold or kind in ctx.job_in_cooldown:
        return None
    why = {
        "rollback": "the failure is in the job's own code or data: roll back to the last good code or checkpoint",
        "restart": "no machine is to blame: restart the job",
    }[kind]
    rails = {"confidence": f"{proposal.confidence:.2f} >= {threshold:.2f}", "blame": proposal.blame}
    return DecisionPlan(
        kind, None, "pending", proposal.confidence, f"{why} ({proposal.summary})", list(proposal.finding_ids), rails
    )


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
