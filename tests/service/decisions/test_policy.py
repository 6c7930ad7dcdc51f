"""Demarcation (findings -> incidents) and the policy's guard rails, on plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ml.demarcation import IncidentProposal, Suspect, demarcate
from ml.findings import Finding
from service.config import Settings
from service.decisions.policy import PolicyContext, decide

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def finding(
    category: str,
    *,
    node: str | None = None,
    confidence: float = 0.95,
    action: str = "evict",
    role: str = "cause",
    blame: str = "infrastructure",
    summary: str = "",
) -> Finding:
    return Finding(
        detector="test",
        category=category,
        subject_kind="node" if node else "job",
        subject=node or "job-1",
        confidence=confidence,
        summary=summary or f"{category} on {node or 'the job'}",
        observed_at=NOW,
        node=node,
        blame=blame,
        role=role,
        action=action,
    )


def settings(**overrides: object) -> Settings:
    return Settings(database_url="postgresql://x", redis_url="redis://x", **overrides)  # type: ignore[arg-type]


def context(**overrides: object) -> PolicyContext:
    values: dict[str, object] = {
        "now": NOW,
        "job_nodes": 8,
        "evicted_last_hour": 0,
        "nodes_in_cooldown": set(),
        "job_in_cooldown": set(),
        "network_events": {},
        "already_decided": set(),
    }
    values.update(overrides)
    return PolicyContext(**values)  # type: ignore[arg-type]


def test_victims_symptoms_join_the_cause_and_a_stall_folds_into_the_hardware_incident() -> None:
    found = [
        (1, finding("gpu_hardware", node="node-3")),
        (2, finding("job_failure", role="symptom", action="none", blame="unknown")),
        (3, finding("hang", action="diagnose", blame="unknown")),
    ]
    (incident,) = demarcate(found)
    assert incident.root_cause == "gpu_hardware"
    assert incident.blame == "infrastructure"
    assert sorted(incident.finding_ids) == [1, 2, 3]
    assert [s.node for s in incident.suspects] == ["node-3"]


def test_symptoms_alone_open_a_job_failure_incident_without_suspects() -> None:
    (incident,) = demarcate([(1, finding("job_failure", role="symptom", action="none", blame="unknown"))])
    assert incident.root_cause == "job_failure"
    assert incident.suspects == []


def test_independent_evidence_about_one_node_adds_up() -> None:
    (incident,) = demarcate(
        [(1, finding("straggler", node="n1", confidence=0.6)), (2, finding("straggler", node="n1", confidence=0.6))]
    )
    assert incident.suspects[0].confidence == pytest.approx(0.84)


def test_evicts_a_confident_hardware_suspect() -> None:
    (incident,) = demarcate([(1, finding("gpu_hardware", node="node-3"))])
    (plan,) = decide(incident, context(), settings())
    assert (plan.kind, plan.node, plan.state) == ("evict", "node-3", "pending")
    assert plan.finding_ids == [1]
    assert "confidence" in plan.guard_rails


def test_a_user_bug_never_evicts_and_asks_for_a_rollback() -> None:
    found = [
        (1, finding("user_code", confidence=0.95, action="rollback", blame="user_code")),
        (2, finding("user_code", node="node-1", confidence=0.9, action="evict", blame="user_code")),
    ]
    (incident,) = demarcate(found)
    plans = decide(incident, context(), settings())
    assert [(p.kind, p.node) for p in plans] == [("rollback", None)]


def test_low_confidence_becomes_diagnose_and_below_that_nothing() -> None:
    (incident,) = demarcate([(1, finding("straggler", node="n1", confidence=0.6))])
    assert [p.kind for p in decide(incident, context(), settings())] == ["diagnose"]
    (incident,) = demarcate([(1, finding("straggler", node="n1", confidence=0.3))])
    assert decide(incident, context(), settings()) == []


def test_network_fault_needs_a_second_flap_within_the_window() -> None:
    (incident,) = demarcate([(1, finding("network", node="n2"))])
    one = {"n2": [NOW - timedelta(seconds=10)]}
    assert decide(incident, context(network_events=one), settings()) == []
    stale = {"n2": [NOW - timedelta(minutes=20), NOW - timedelta(seconds=10)]}
    assert decide(incident, context(network_events=stale), settings()) == []
    two = {"n2": [NOW - timedelta(minutes=3), NOW - timedelta(seconds=10)]}
    (plan,) = decide(incident, context(network_events=two), settings())
    assert (plan.kind, plan.state) == ("evict", "pending")
    assert "flap_tolerance" in plan.guard_rails


def test_a_failed_network_adapter_is_not_a_flap() -> None:
    # IBV_EVENT_DEVICE_FATAL (tests/fixtures/logs/nccl_ib_async_catastrophic_mpirun_nccl_230.txt): the HCA itself
    # failed, so one occurrence is enough; a link error on another node still waits for its second flap.
    (incident,) = demarcate([(1, finding("network", node="n2"))])
    one = {"n2": [NOW - timedelta(seconds=10)]}
    (plan,) = decide(incident, context(network_events=one, network_fatal={"n2"}), settings())
    assert (plan.kind, plan.node) == ("evict", "n2")
    assert "not a flap" in plan.guard_rails["flap_tolerance"]
    assert decide(incident, context(network_events=one, network_fatal={"n3"}), settings()) == []


def test_a_lone_flap_that_broke_the_jobs_connections_is_enough() -> None:
    (incident,) = demarcate([(1, finding("network", node="n2"))])
    one = {"n2": [NOW - timedelta(seconds=15)]}
    (plan,) = decide(incident, context(network_events=one, network_broken={"n2": one["n2"][0]}), settings())
    assert (plan.kind, plan.node, plan.state) == ("evict", "n2", "pending")
    assert "broke the job's connections" in plan.guard_rails["flap_tolerance"]
    assert decide(incident, context(network_events=one, network_broken={"n3": one["n2"][0]}), settings()) == []


def test_blast_radius_holds_evictions_beyond_the_share_for_approval() -> None:
    found = [(i, finding("gpu_hardware", node=f"n{i}")) for i in range(1, 4)]
    # Three machines' faults are three incidents; the rail counts the job's evictions across them.
    incidents = demarcate(found)
    assert sorted(i.anchor for i in incidents) == ["n1", "n2", "n3"]
    states = [
        plan.state
        for done, incident in enumerate(incidents)
        for plan in decide(
            incident, context(job_nodes=8, evicted_last_hour=done), settings(policy_max_evict_share_per_hour=0.25)
        )
    ]
    assert states == ["pending", "pending", "awaiting_approval"]
    (plan,) = decide(
        incidents[0], context(job_nodes=8, evicted_last_hour=2), settings(policy_max_evict_share_per_hour=0.25)
    )
    assert plan.state == "awaiting_approval" and "blast_radius" in plan.guard_rails


def test_cooldown_and_already_decided_suppress_repeats() -> None:
    (incident,) = demarcate([(1, finding("gpu_hardware", node="n1"))])
    assert decide(incident, context(nodes_in_cooldown={"n1"}), settings()) == []
    assert decide(incident, context(already_decided={("evict", "n1")}), settings()) == []


@pytest.mark.parametrize(
    ("overrides", "state"),
    [
        ({"policy_mode": "shadow"}, "shadow"),
        ({"policy_mode": "approval"}, "awaiting_approval"),
        ({"policy_approval_required_for": ["evict"]}, "awaiting_approval"),
        ({"policy_approval_required_for": ["rollback"]}, "pending"),
    ],
)
def test_modes(overrides: dict[str, object], state: str) -> None:
    (incident,) = demarcate([(1, finding("gpu_hardware", node="n1"))])
    (plan,) = decide(incident, context(), settings(**overrides))
    assert plan.state == state


def test_thresholds_are_configurable() -> None:
    (incident,) = demarcate([(1, finding("gpu_hardware", node="n1", confidence=0.85))])
    assert decide(incident, context(), settings(policy_evict_min_confidence=0.9))[0].kind == "diagnose"
    assert decide(incident, context(), settings(policy_evict_min_confidence=0.8))[0].kind == "evict"


def test_a_localized_stall_adds_the_job_level_evidence_to_its_only_suspect() -> None:
    found = [
        (1, finding("straggler", confidence=0.8, action="diagnose", blame="unknown")),
        (2, finding("straggler", node="n2", confidence=0.7)),
    ]
    (incident,) = demarcate(found)
    assert incident.suspects[0].confidence == pytest.approx(1 - 0.3 * 0.6)
    (plan,) = decide(incident, context(), settings())
    assert (plan.kind, plan.node) == ("evict", "n2")
    # Two candidates: the job-level finding cannot tell which, so it adds nothing.
    (incident,) = demarcate([*found, (3, finding("straggler", node="n3", confidence=0.7))])
    assert [s.confidence for s in incident.suspects] == [0.7, 0.7]


def _resettable(node: str = "node-3", address: str = "0000:3b:00") -> IncidentProposal:
    """A fault whose Xid line names one GPU by PCI address and whose catalog action is a reset of that GPU."""
    suspect = Suspect(node, 0.9, "evict", (7,), f"Xid 119 (GSP RPC timeout) on {node} GPU {address}", address)
    return IncidentProposal("gpu_hardware", "infrastructure", 0.9, "major", "gpu hardware", [7], [suspect])


def test_a_gpu_the_inventory_knows_is_reset_by_index() -> None:
    ctx = context(gpu_indexes={("node-3", "0000:3b:00"): 2})
    (plan,) = decide(_resettable(), ctx, settings())
    assert (plan.kind, plan.node, plan.gpu, plan.gpu_pci, plan.state) == ("reset_gpu", "node-3", 2, None, "pending")
    assert plan.reason.startswith("reset GPU 2 on node-3: Xid 119 ")
    assert plan.guard_rails["gpu_reset"] == "0 earlier reset(s) of GPU 2 in the last 24 h (at most 1)"
    assert "gpu_address" not in plan.guard_rails


def test_a_node_without_gpu_inventory_gets_a_reset_by_pci_bus_id_not_an_eviction() -> None:
    (plan,) = decide(_resettable(), context(), settings())
    assert (plan.kind, plan.node, plan.gpu, plan.gpu_pci) == ("reset_gpu", "node-3", None, "0000:3b:00.0")
    assert plan.reason.startswith(
        "reset GPU 0000:3b:00.0 on node-3 (not in its GPU inventory: addressed by PCI bus id): Xid 119 "
    )
    assert plan.guard_rails["gpu_reset"] == "0 earlier reset(s) of GPU 0000:3b:00.0 in the last 24 h (at most 1)"
    assert plan.guard_rails["gpu_address"] == "not in node-3's GPU inventory: addressed by PCI bus id"
    # Another node's inventory naming the same address says nothing of this node's GPU.
    (other,) = decide(_resettable(), context(gpu_indexes={("node-4", "0000:3b:00"): 2}), settings())
    assert (other.gpu, other.gpu_pci) == (None, "0000:3b:00.0")


def test_too_many_resets_of_a_gpu_by_pci_evict_the_node() -> None:
    earlier = {("node-3", "0000:3b:00"): [NOW - timedelta(hours=2)]}
    (plan,) = decide(_resettable(), context(gpu_resets=earlier), settings())
    assert (plan.kind, plan.gpu, plan.gpu_pci) == ("evict", None, None)
    assert plan.reason.startswith(
        "evict node-3 to reboot it, rung 3 of 5 (reboot): GPU 0000:3b:00.0 was already reset 1 time in the last 24 h "
        "(at most 1); Xid 119 "
    )
    # The reset limit's own escalation stays among the guard rails; the ladder says the reset did not hold.
    assert plan.guard_rails["gpu_reset"].endswith("escalated to evicting the node")
    assert plan.ladder == {
        "rung": "reboot",
        "number": 3,
        "of": 5,
        "base": "reboot",
        "why": "GPU 0000:3b:00.0 was already reset 1 time in the last 24 h (at most 1)",
    }
    # The count is by address whichever way the earlier reset named the GPU: with the inventory, the same.
    ctx = context(gpu_resets=earlier, gpu_indexes={("node-3", "0000:3b:00"): 2})
    (by_index,) = decide(_resettable(), ctx, settings())
    assert by_index.kind == "evict" and by_index.guard_rails["gpu_reset"].startswith("GPU 2 was already reset 1 time")
    # Resets of another GPU, or outside the window, do not count.
    other = {("node-3", "0000:5d:00"): [NOW], ("node-3", "0000:3b:00"): [NOW - timedelta(days=2)]}
    (plan,) = decide(_resettable(), context(gpu_resets=other), settings())
    assert (plan.kind, plan.gpu_pci) == ("reset_gpu", "0000:3b:00.0")
    assert plan.guard_rails["gpu_reset"] == "0 earlier reset(s) of GPU 0000:3b:00.0 in the last 24 h (at most 1)"


def test_a_reset_gpu_address_that_is_no_pci_address_evicts() -> None:
    (plan,) = decide(_resettable(address="GPU-3"), context(), settings())
    assert (plan.kind, plan.gpu, plan.gpu_pci) == ("evict", None, None)
    assert plan.guard_rails["gpu_reset"] == "GPU GPU-3 is neither in node-3's GPU inventory nor a PCI address"
