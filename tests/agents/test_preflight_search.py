"""The preflight's search (agents/preflight/search.py) on modelled allocations: the three fault shapes (a bad GPU, a
slow NIC, a broken pair link) are named, and no healthy node is, in log2 rounds rather than N^2 pairs."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import pytest

from agents.preflight.search import Criteria, Figures, Group, LocalReport, halves, judge_local, search


class Fabric:
    """A modelled allocation: a group's bandwidth is its slowest member's NIC (a ring waits for it); a group holding
    both ends of a broken link times out (the all-to-all crosses every pair)."""

    def __init__(
        self, slow: Iterable[str] = (), broken: Iterable[tuple[str, str]] = (), noise: float = 0.0, seed: int = 0
    ):
        self.slow, self.broken = set(slow), [set(p) for p in broken]
        self.noise, self.rng = noise, random.Random(seed)
        self.rounds: list[list[Group]] = []

    def __call__(self, groups: list[Group]) -> list[Figures]:
        members = [n for g in groups for n in g]
        assert len(members) == len(set(members)), f"a node in two groups of one round: {groups}"
        assert all(len(g) >= 2 for g in groups), groups
        self.rounds.append(groups)
        out = []
        for g in groups:
            if any(pair <= set(g) for pair in self.broken):
                out.append(Figures(error="timed out after 30 s"))
                continue
            jitter = 1 + self.rng.uniform(-self.noise, self.noise)
            out.append(Figures(min(5.0 if n in self.slow else 45.0 for n in g) * jitter, 25.0 * jitter))
        return out


def nodes(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


def local(names: list[str], bad: Iterable[str] = (), *, tflops: float = 780.0) -> dict[str, LocalReport]:
    bad = set(bad)
    return {n: LocalReport(n, figures={"gemm_tflops": tflops * (0.6 if n in bad else 1.0)}) for n in names}


def test_halves_keep_order_and_cover_the_group():
    assert halves(("a", "b", "c", "d", "e")) == (("a", "b", "c"), ("d", "e"))
    assert halves(("a", "b")) == (("a",), ("b",))


def test_a_healthy_allocation_names_nobody_in_log2_rounds():
    names = nodes(64)
    fabric = Fabric(noise=0.05)
    out = search(names, fabric, local=local(names))
    assert out.named == [] and out.unresolved == [] and out.complete
    # local, then pairs, 4, 8, 16, 32, 64: 1 + log2(64) rounds, one measurement per group of each level.
    assert [r.phase for r in out.rounds] == ["local", "pairs"] + [f"groups of {2**k}" for k in range(2, 7)]
    assert out.measurements == 32 + 16 + 8 + 4 + 2 + 1


def test_a_slow_nic_is_named_and_its_pair_partner_is_not():
    names = nodes(16)
    fabric = Fabric(slow=["node-009"], noise=0.05)
    out = search(names, fabric, local=local(names))
    assert [(n.node, n.shape) for n in out.named] == [("node-009", "slow")]
    # Failed its pair, then alone with a known-good node, twice: the failing rounds are counted in the name.
    assert len(out.named[0].rounds) == 3
    assert out.unresolved == []
    # Its partner in the first round was measured with another known-good node and passed.
    bisect = next(r for r in out.rounds if r.phase == "bisect")
    assert {m.verdict for m in bisect.groups} == {"pass", "fail"}
    assert all(m.ref is not None and m.ref not in ("node-008", "node-009") for m in bisect.groups)


class Hiccup(Fabric):
    """A healthy allocation whose groups holding `node` are slow in the first `times` rounds it is measured in only
    (a link busy for a moment, a host's cores shared with a neighbour): not the node's fault."""

    def __init__(self, node: str, times: int) -> None:
        super().__init__()
        self.node, self.left = node, times

    def __call__(self, groups: list[Group]) -> list[Figures]:
        out = super().__call__(groups)
        for i, g in enumerate(groups):
            if self.node in g and self.left > 0:
                self.left -= 1
                out[i] = Figures(4.0, 25.0)
        return out


def test_a_node_slow_once_and_fine_when_measured_again_is_not_named():
    names = nodes(8)
    out = search(names, Hiccup("node-005", times=2), local=local(names))  # its pair, then alone with a good node
    assert out.named == [] and out.unresolved == []
    alone = [m for r in out.rounds for m in r.groups if m.nodes[0] == "node-005" and m.ref is not None]
    assert [m.verdict for m in alone] == ["fail", "pass"]
    # Slow in all three: named.
    out = search(names, Hiccup("node-005", times=3), local=local(names))
    assert [(n.node, n.shape) for n in out.named] == [("node-005", "slow")]


def test_a_slow_nic_in_the_odd_trio_of_the_first_round_is_named():
    names = nodes(9)  # four pairs and a trio
    out = search(names, Fabric(slow=["node-008"], noise=0.05), local=local(names))
    assert [(n.node, n.shape) for n in out.named] == [("node-008", "slow")]
    assert out.rounds[1].groups[-1].nodes == ("node-006", "node-007", "node-008")


def test_a_bad_gpu_is_named_from_its_own_checks_and_kept_out_of_the_network_rounds():
    names = nodes(8)
    out = search(names, Fabric(), local=local(names, bad=["node-003"]))
    assert [(n.node, n.shape) for n in out.named] == [("node-003", "local")]
    assert "gemm_tflops" in out.named[0].why
    assert all("node-003" not in m.nodes for r in out.rounds[1:] for m in r.groups)


def test_local_failures_come_from_the_suite_the_fleet_and_the_allocation():
    reports = {
        "a": LocalReport("a", failures=("gemm_bf16 gpu:3: 610 below 700",), figures={"gemm_tflops": 790.0}),
        "b": LocalReport("b", figures={"gemm_tflops": 700.0}),  # below the fleet's floor, but not 15% off the median
        "c": LocalReport("c", figures={"gemm_tflops": 790.0, "allreduce_node_gbps": 410.0}),
        "d": LocalReport("d", figures={"gemm_tflops": 780.0, "allreduce_node_gbps": 300.0}),  # 15% below the median
        "e": LocalReport("e", figures={"gemm_tflops": 795.0, "allreduce_node_gbps": 400.0}),
    }
    failed = judge_local(reports, Criteria(local_floors={"gemm_tflops": 720.0}))
    assert set(failed) == {"a", "b", "d"}
    assert "gpu:3" in failed["a"] and "fleet" in failed["b"] and "median" in failed["d"]
    # Without the fleet's floor, and with too few nodes for a median, only what the nodes reported fails.
    assert set(judge_local({k: reports[k] for k in "ab"}, Criteria())) == {"a"}


@pytest.mark.parametrize(
    "pair",
    [
        ("node-004", "node-005"),  # partners in the first round
        ("node-004", "node-006"),  # meet in a group of 4
        ("node-001", "node-030"),  # meet only in the whole allocation
    ],
)
def test_a_broken_pair_is_named_on_both_ends_by_bisecting_across_the_cut(pair):
    names = nodes(32)
    fabric = Fabric(broken=[pair])
    out = search(names, fabric, local=local(names))
    assert sorted((n.node, n.shape, n.peer) for n in out.named) == sorted(
        [(pair[0], "pair", pair[1]), (pair[1], "pair", pair[0])]
    )
    # Across the cut in log2 steps of each side, never all the pairs between the halves (16 x 16).
    cut = [r for r in out.rounds if r.phase == "bisect"]
    assert len(cut) <= 2 * math.ceil(math.log2(32)) + 2
    assert out.measurements < 32 + 16 + 8 + 4 + 2 + 1 + 16


def test_the_three_shapes_at_once_on_64_nodes_name_exactly_the_planted_nodes():
    names = nodes(64)
    fabric = Fabric(slow=["node-017"], broken=[("node-005", "node-050")], noise=0.05, seed=3)
    out = search(names, fabric, local=local(names, bad=["node-040"]))
    assert {(n.node, n.shape) for n in out.named} == {
        ("node-040", "local"),
        ("node-017", "slow"),
        ("node-005", "pair"),
        ("node-050", "pair"),
    }
    assert out.unresolved == [] and out.complete
    assert len(out.rounds) <= 30
    assert out.measurements < 64 * 63 // 2 // 10  # a tenth of the pairs, at most


@pytest.mark.parametrize("seed", range(12))
def test_random_allocations_name_every_planted_fault_and_nothing_else(seed):
    rng = random.Random(seed)
    names = nodes(rng.randint(6, 120))
    planted = rng.sample(names, 4)
    bad_gpu, slow, pair = planted[0], planted[1], (planted[2], planted[3])
    fabric = Fabric(slow=[slow], broken=[pair], noise=0.08, seed=seed)
    out = search(names, fabric, local=local(names, bad=[bad_gpu]))
    assert out.bad == sorted(planted), (len(names), planted, [(n.node, n.shape, n.why) for n in out.named])
    assert out.unresolved == []


def test_a_failure_that_does_not_reproduce_names_nobody():
    names = nodes(8)
    calls = {"n": 0}

    def flaky(groups: list[Group]) -> list[Figures]:
        calls["n"] += 1
        # The whole allocation fails once (a blip on the fabric), and nothing else ever does.
        return [Figures(error="timed out") if len(g) == 8 and calls["n"] == 3 else Figures(40.0, 20.0) for g in groups]

    out = search(names, flaky)
    assert out.named == []
    assert len(out.unresolved) == 1 and out.unresolved[0].shape == "unresolved"


def test_two_nodes_without_a_third_to_tell_them_apart_name_nobody():
    out = search(["a", "b"], Fabric(slow=["a"]), criteria=Criteria(min_busbw_gbps=10.0))
    assert out.named == []
    assert {n.node for n in out.unresolved} == {"a", "b"}
    assert "no known-good node" in out.unresolved[0].why


def test_the_deadline_stops_the_search_without_naming_anyone_wrongly():
    names = nodes(32)
    fabric = Fabric(broken=[("node-001", "node-030")])
    out = search(names, fabric, local=local(names), stop=lambda: len(fabric.rounds) >= 7)
    assert not out.complete
    assert out.named == []  # the pair's search had not ended
    assert len(fabric.rounds) == 7


def test_the_fleets_floor_fails_a_group_that_is_slow_everywhere():
    names = nodes(4)
    out = search(names, Fabric(), criteria=Criteria(min_busbw_gbps=100.0))
    assert out.rounds[0].groups[0].verdict == "fail"
    assert "floor" in out.rounds[0].groups[0].why
