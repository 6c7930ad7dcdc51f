"""Shared causes on plain data: which nodes one component explains, and which coincidences it never groups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ml.shared_causes import (
    NodeFinding,
    Params,
    Rival,
    SharedGroup,
    against_rivals,
    chance_at_least,
    detect,
    label_values,
)

T0 = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def _fleet(nodes: int = 64, per_switch: int = 8, driver: Any = "550.54.15") -> dict[str, dict[str, Any]]:
    """A fleet: 8 nodes per leaf switch, 16 per rack, one driver everywhere, one shared mount."""
    return {
        f"n{i:03d}": {
            "switch": f"leaf-{i // per_switch}",
            "rack": f"rack-{i // 16}",
            "driver_version": driver(i) if callable(driver) else driver,
            "storage_mounts": ["/data", f"/scratch{i % 2}"],
        }
        for i in range(nodes)
    }


def _f(node: str, category: str = "network", at: float = 0.0, fid: int | None = None) -> NodeFinding:
    return NodeFinding(node, category, T0 + timedelta(seconds=at), fid)


def test_a_switch_down_groups_its_nodes_under_the_switch() -> None:
    fleet = _fleet()
    findings = [_f(f"n{i:03d}", at=i * 5, fid=i) for i in range(8, 16)]  # every node behind leaf-1
    (group,) = detect(findings, fleet)
    assert (group.component_kind, group.component, group.category) == ("switch", "leaf-1", "network")
    assert group.nodes == tuple(f"n{i:03d}" for i in range(8, 16))
    assert group.finding_ids == tuple(range(8, 16))
    assert group.value_nodes == 8 and group.labelled_nodes == 64
    assert "rack rack-0" in group.also  # the rack names the same nodes: the switch, more specific, is named
    assert group.chance < 1e-9 and group.confidence == 0.99
    assert "leaf-1" in group.summary and group.evidence()["categories"] == ["network"]


def test_one_faulty_node_is_never_grouped() -> None:
    assert detect([_f("n003", "gpu_hardware")], _fleet()) == []
    assert detect([_f("n003"), _f("n003", at=10)], _fleet()) == []


def test_a_label_the_whole_fleet_shares_groups_nothing() -> None:
    # Five unrelated Xids within the window on five nodes of different switches, one driver everywhere.
    findings = [_f(f"n{i:03d}", "gpu_hardware", at=i) for i in (1, 12, 23, 34, 45)]
    assert detect(findings, _fleet()) == []
    assert chance_at_least(5, 5, 64, 64) == 1.0


def test_a_bad_driver_rollout_groups_the_nodes_on_the_new_version() -> None:
    # A quarter of the fleet got 560.28.03; each of its nodes throws the same Xid.
    fleet = _fleet(driver=lambda i: "560.28.03" if i % 4 == 0 else "550.54.15")
    rolled = [n for n, labels in fleet.items() if labels["driver_version"] == "560.28.03"]
    findings = [_f(n, "gpu_hardware", at=k * 3) for k, n in enumerate(rolled)]
    (group,) = detect(findings, fleet)
    assert (group.component_kind, group.component) == ("driver", "560.28.03")
    assert set(group.nodes) == set(rolled)


def test_too_few_of_a_big_value_are_separate_faults() -> None:
    # 3 of the 16 nodes on a driver erring: below half of them.
    fleet = _fleet(driver=lambda i: "560.28.03" if i % 4 == 0 else "550.54.15")
    findings = [_f(f"n{i:03d}", "gpu_hardware") for i in (0, 20, 40)]  # three racks
    assert detect(findings, fleet) == []
    # With a lower share required, the same three group (they are concentrated: 3 of 3 on a quarter of the fleet).
    (group,) = detect(findings, fleet, Params(min_share=0.1))
    assert group.component == "560.28.03"


def test_findings_that_started_too_far_apart_do_not_group() -> None:
    findings = [_f(f"n{i:03d}", at=i * 200) for i in range(8, 16)]  # one node every 200 s
    assert detect(findings, _fleet(), Params(window_s=300)) == []
    # Within the window, a run of them still does: the densest run counts.
    # At most 2 start within 300 s: below min_nodes, whatever share is asked.
    assert detect(findings, _fleet(), Params(window_s=300, min_share=0.25)) == []
    (group,) = detect(findings, _fleet(), Params(window_s=300, min_share=0.25, min_nodes=2))
    assert group.nodes == ("n008", "n009")  # the earliest densest run


def test_faults_spread_over_the_fleet_with_a_few_on_one_switch_do_not_group() -> None:
    # 4 nodes of leaf-1 and 6 elsewhere: not concentrated on the switch.
    findings = [_f(f"n{i:03d}") for i in (8, 9, 10, 11, 20, 30, 40, 50, 60, 33)]
    assert detect(findings, _fleet()) == []


def test_a_storage_outage_groups_by_the_mount_every_node_reads_only_when_the_others_are_fine() -> None:
    # Every node mounts /data: an outage of /data stalls the whole fleet, which no base rate can separate from the
    # fleet itself; a mount on half the fleet (/scratch1) is.
    fleet = _fleet()
    on_scratch1 = [n for n, labels in fleet.items() if "/scratch1" in labels["storage_mounts"]]
    findings = [_f(n, "storage", at=1) for n in on_scratch1]
    (group,) = detect(findings, fleet)
    assert (group.component_kind, group.component) == ("storage", "/scratch1")
    assert len(group.nodes) == 32


def test_categories_a_component_cannot_cause_and_unlabelled_fleets_group_nothing() -> None:
    findings = [_f(f"n{i:03d}", "user_code") for i in range(8, 16)]
    assert detect(findings, _fleet()) == []
    # A switch drops links; it throws no Xid: eight Xids behind one switch name the rack instead.
    xids = [_f(f"n{i:03d}", "gpu_hardware") for i in range(8, 16)]
    (group,) = detect(xids, _fleet(), Params(min_share=0.5))
    assert group.component_kind == "rack"
    assert detect([_f(f"n{i:03d}") for i in range(8, 16)], {f"n{i:03d}": {} for i in range(64)}) == []


def test_label_values_read_scalars_and_lists() -> None:
    assert label_values({"switch": "leaf-1"}, "switch") == ["leaf-1"]
    assert label_values({"storage_mounts": ["/data", ""]}, "storage_mounts") == ["/data"]
    assert label_values({"switch": ""}, "switch") == []
    assert label_values({}, "rack") == []


def test_chance_at_least_matches_the_hypergeometric_tail() -> None:
    # 4 faulty nodes all on a value half of a 12-node fleet has: C(6,4)/C(12,4).
    assert abs(chance_at_least(4, 4, 6, 12) - 15 / 495) < 1e-12
    assert chance_at_least(0, 4, 6, 12) == 1.0


def test_gpu_errors_on_nodes_that_share_a_new_driver_and_a_rack_name_the_driver() -> None:
    # The rollout reached exactly rack-0's nodes: the labels tie; the version only they run is named, the rack kept.
    fleet = _fleet(driver=lambda i: "570.86.10" if i < 16 else "550.54.15")
    (group,) = detect([_f(f"n{i:03d}", "gpu_hardware", at=i) for i in range(16)], fleet)
    assert (group.component_kind, group.component) == ("driver", "570.86.10")
    assert "rack rack-0" in group.also


def test_rival_groups_over_mostly_the_same_nodes_keep_one() -> None:
    # The rollout reached nodes 0, 2, 3 and 16 (a spare had joined the job); nodes 0-3 share rack-0, and node 1 had a
    # GPU fault of its own in the same minutes: the rack groups 4 of the 5 faulty nodes too, but it is the same
    # failure explained twice. One group: the driver, the rack kept as `also`.
    fleet = _fleet(driver=lambda i: "570.86.10" if i in (0, 2, 3, 16) else "550.54.15")
    findings = [_f(f"n{i:03d}", "gpu_hardware", at=i) for i in (0, 1, 2, 3, 16)]
    (group,) = detect(findings, fleet, Params(min_share=0.25, min_concentration=0.75))
    assert (group.component_kind, group.nodes) == ("driver", ("n000", "n002", "n003", "n016"))
    assert group.also == ("rack rack-0",)


def _group(nodes: list[str], ids: list[int], kind: str = "driver", component: str = "560") -> Any:
    return SharedGroup(
        component_kind=kind, component=component, label="driver_version", category="gpu_hardware",
        nodes=tuple(nodes), finding_ids=tuple(ids), first_at=T0, last_at=T0, value_nodes=4, labelled_nodes=24,
        faulty_nodes=len(nodes), lift=6.0, chance=0.001,
    )  # fmt: skip


def test_against_rivals_supersedes_a_smaller_rival_and_is_trimmed_by_a_larger_one() -> None:
    node_of = {1: {"a"}, 2: {"b"}, 3: {"c"}, 4: {"d"}, 5: {"e"}}
    smaller = Rival(7, "power_domain", "pdu-0", frozenset({1, 2, 3}), members=3)
    group, superseded = against_rivals(_group(["a", "b", "c", "d"], [1, 2, 3, 4]), [smaller], node_of, 3)
    assert group is not None and group.nodes == ("a", "b", "c", "d") and superseded == [7]
    # Over as many nodes, the likelier kind for GPU errors wins: the driver over the power domain.
    tie = Rival(11, "power_domain", "pdu-0", frozenset({1, 2, 3}), members=4)
    assert against_rivals(_group(["a", "b", "c", "d"], [1, 2, 3, 4]), [tie], node_of, 3)[1] == [11]
    # A rival over as many nodes keeps its findings: what is left (one node) is no group.
    larger = Rival(8, "driver", "560", frozenset({1, 2, 3}), members=4)
    assert against_rivals(
        _group(["a", "b", "c", "e"], [1, 2, 3, 5], "power_domain", "pdu-0"), [larger], node_of, 3
    ) == (None, [])
    # Enough left of its own: the group stands without the claimed findings.
    group, superseded = against_rivals(
        _group(["a", "b", "c", "d", "e"], [1, 2, 3, 4, 5], "switch", "leaf-1"),
        [Rival(9, "driver", "560", frozenset({1, 2}), members=5)],
        node_of,
        3,
    )
    assert group is not None and group.nodes == ("c", "d", "e") and group.finding_ids == (3, 4, 5) and superseded == []
    # Its own component's incident is no rival.
    same = Rival(10, "driver", "560", frozenset({1, 2, 3}), members=4)
    assert against_rivals(_group(["a", "b", "c"], [1, 2, 3]), [same], node_of, 3)[0] is not None
