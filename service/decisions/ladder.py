"""The escalation ladder in the policy: a node's plan (reset_gpu or evict) raised to the rung its history asks for.

The rung its evidence alone asks for (its base): a GPU reset for a reset_gpu plan; a reboot for an eviction that the
GPU reset limit escalated (the reset did not hold) or whose finding says the machine needs a reboot; a repair for
any other eviction. The node's history (ml/ladder.py, read by service/nodes/ladder.py) may raise it: its last
remedy for the same family did not hold, many faults in a day, many remedies in a week. Rungs above a GPU reset
are evictions (every scheduler takes a node out the same way; people reboot, repair or replace it), told apart by
the decision's reason and its evidence's `ladder`; a vendor replacement marks the node when it is carried out.
Pure: the caller gives the history.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ml.ladder import NO_REMEDY, RUNGS, History, Rung, climb
from service.config import Settings
from service.nodes.ladder import thresholds

# How each rung above a reset reads in a decision's reason: "evict node-7 to reboot it, rung 3 of 5 ...".
_TAKE_OUT = {
    "reboot": "evict {node} to reboot it",
    "repair": "evict {node} for repair",
    "rma": "evict {node} for a vendor replacement (RMA)",
}


class Plan(Protocol):
    """What the ladder changes of a policy plan (service/decisions/policy.py's DecisionPlan)."""

    kind: str
    node: str | None
    state: str
    reason: str
    guard_rails: dict[str, str]
    gpu: int | None
    gpu_pci: str | None
    ladder: dict[str, Any] | None


def base_rung(plan: Plan, suspect_reason: str) -> str:
    if plan.kind == "reset_gpu":
        return "reset_gpu"
    if "escalated" in plan.guard_rails.get("gpu_reset", "") or "needs a reboot" in suspect_reason:
        return "reboot"
    return "repair"


def fault_time(history: History, family: str, now: datetime) -> datetime:
    """The fault being decided: the node's latest of this family (the suspect's findings are among them)."""
    return max((f.at for f in history.faults if f.family == family and f.at <= now), default=now)


def escalate(
    plan: Plan,
    *,
    suspect_reason: str,
    root_cause: str,
    history: History,
    now: datetime,
    settings: Settings,
    budget: int,
    job_nodes: int,
    evicted_last_hour: int,
) -> Rung | None:
    """Put the plan on its rung (in place): its evidence and guard rails say which and why; a reset raised above
    its rung becomes an eviction, within the blast radius (over it, it waits for a person). None when off."""
    if not settings.policy_ladder_enabled or plan.node is None or plan.kind not in ("reset_gpu", "evict"):
        return None
    base = base_rung(plan, suspect_reason)
    rung = climb(
        base, history, family=root_cause, at=fault_time(history, root_cause, now), thresholds=thresholds(settings)
    )
    if rung.why == NO_REMEDY and base == "reboot" and "escalated" in plan.guard_rails.get("gpu_reset", ""):
        # The reset limit itself says the reset did not hold (an earlier reset this history may not show).
        rung = Rung(rung.name, base, plan.guard_rails["gpu_reset"].split(": escalated")[0])
    plan.guard_rails["ladder"] = rung.describe()
    plan.ladder = {"rung": rung.name, "number": rung.number, "of": len(RUNGS), "base": base, "why": rung.why}
    if rung.name == "reset_gpu" or (rung.name == "repair" and not rung.climbed):
        return rung  # the plan is the rung's remedy already
    if plan.kind == "reset_gpu":
        plan.kind, plan.gpu, plan.gpu_pci = "evict", None, None
        if budget <= 0:
            plan.state = "awaiting_approval"
            plan.guard_rails["blast_radius"] = (
                f"over the limit of {settings.policy_max_evict_share_per_hour:.0%} of {job_nodes} nodes per hour"
            )
        else:
            plan.guard_rails["blast_radius"] = f"{evicted_last_hour} evicted in the last hour, within the limit"
    plan.reason = f"{_TAKE_OUT[rung.name].format(node=plan.node)}, {rung.describe()}; {suspect_reason}"
    return rung
