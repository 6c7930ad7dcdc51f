"""The escalation ladder inside the policy, on plain data: a reset raised to an eviction keeps the blast radius; an
eviction's evidence sets the floor; the ladder switched off changes nothing; a diagnose or a job decision is no
rung."""

from __future__ import annotations

from datetime import timedelta

from ml.demarcation import IncidentProposal, Suspect
from ml.ladder import Fault, History, Remedy
from service.decisions.policy import DecisionPlan, PolicyContext, decide
from tests.service.decisions.test_policy import NOW, _resettable, context, settings


def _history(*remedies: tuple[str, float]) -> dict[str, History]:
    """node-3's remedies (rung, hours before NOW), each for a GPU fault 10 s before it, and a GPU fault now."""
    faults = [Fault(NOW - timedelta(hours=h, seconds=10), "gpu_hardware") for _, h in remedies]
    return {
        "node-3": History(
            [Remedy(rung, NOW - timedelta(hours=h), "gpu_hardware") for rung, h in remedies],
            [*faults, Fault(NOW, "gpu_hardware")],
        )
    }


def test_a_reset_that_did_not_hold_is_raised_to_a_reboot_within_the_blast_radius() -> None:
    (plan,) = decide_one(context(ladders=_history(("restart", 5.0), ("reset_gpu", 3.0))))
    assert (plan.kind, plan.gpu, plan.gpu_pci, plan.state) == ("evict", None, None, "pending")
    assert plan.reason.startswith(
        "evict node-3 to reboot it, rung 3 of 5 (reboot): 3rd GPU fault in 24 h, 3 h after the GPU reset at 09:00: "
        "it did not hold; Xid 119 "
    )
    assert plan.guard_rails["blast_radius"] == "0 evicted in the last hour, within the limit"
    # Over the job's eviction budget (2 of 8 nodes an hour), the raised eviction waits for a person.
    (held,) = decide_one(context(ladders=_history(("reset_gpu", 3.0)), evicted_last_hour=2))
    assert (held.kind, held.state) == ("evict", "awaiting_approval")
    assert held.guard_rails["blast_radius"] == "over the limit of 25% of 8 nodes per hour"


def test_an_eviction_stays_a_repair_until_its_repair_did_not_hold() -> None:
    proposal = IncidentProposal(
        "gpu_hardware", "infrastructure", 0.95, "critical", "gpu", [1],
        [Suspect("node-3", 0.95, "evict", (1,), "Xid 79 (GPU has fallen off the bus) on node-3")],
    )  # fmt: skip
    (plain,) = decide(proposal, context(), settings())
    assert (plain.kind, plain.ladder and plain.ladder["rung"]) == ("evict", "repair")
    assert plain.reason == "evict node-3: Xid 79 (GPU has fallen off the bus) on node-3"  # unchanged
    assert plain.guard_rails["ladder"] == "rung 4 of 5 (repair): no earlier remedy for this fault"
    # A reset an hour ago did not hold, but this fault needs the node out anyway: still a repair.
    (after_reset,) = decide(proposal, context(ladders=_history(("reset_gpu", 1.0))), settings())
    assert after_reset.reason == "evict node-3: Xid 79 (GPU has fallen off the bus) on node-3"
    # Its repair did not hold: a vendor replacement.
    (rma,) = decide(proposal, context(ladders=_history(("repair", 6.0))), settings())
    assert rma.reason.startswith("evict node-3 for a vendor replacement (RMA), rung 5 of 5 (rma): ")


def test_the_ladder_switched_off_changes_nothing() -> None:
    off = settings(policy_ladder_enabled=False)
    (plan,) = decide(_resettable(), context(ladders=_history(("reset_gpu", 3.0))), off)
    assert (plan.kind, plan.ladder) == ("reset_gpu", None)
    assert "ladder" not in plan.guard_rails


def test_a_diagnose_is_no_rung() -> None:
    proposal = IncidentProposal(
        "gpu_hardware", "unknown", 0.6, "major", "gpu", [1],
        [Suspect("node-3", 0.6, "diagnose", (1,), "illegal memory access on node-3")],
    )  # fmt: skip
    (plan,) = decide(proposal, context(ladders=_history(("reset_gpu", 1.0))), settings())
    assert (plan.kind, plan.ladder) == ("diagnose", None)


def decide_one(ctx: PolicyContext) -> list[DecisionPlan]:
    return decide(_resettable(), ctx, settings())
