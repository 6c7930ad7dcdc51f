"""The preflight's search, pure: which groups of nodes to measure, round by round, until every bad node is named.

No torch, no network (a clock only times rounds, for people): a `measure` function runs one round of groups
(disjoint, so they run at once) and returns their figures; the real runner (agents/preflight/runner.py) measures
with torch.distributed, the lab's simulated allocation (lab/sim/preflight.py) with a model of the fabric. Both run
this very code.

The three fault shapes, and how each is found:
  - a bad GPU: the node's own checks (GEMM, all-reduce across its GPUs) fail; named before any cross-node round.
  - a slow NIC: every group holding the node is slow. The first cross-node round measures disjoint pairs at once;
    their median is the reference, and a pair this far below it (`Criteria.slow_share`) is slow. Each member is then
    measured with a known-good node: the one still slow is named.
  - a broken pair link (each end fine with others): groups holding both ends fail, groups with one pass. Passing
    groups are merged level by level (pairs, fours, eights... to the whole allocation, log2 N rounds); a merged group
    that fails while both its halves passed holds a bad pair across the cut: both sides are halved and the halves
    crossed, two disjoint groups a round, until one node is left on each: log2 steps, never N^2 pairs.
A failed group whose halves are not known to pass is bisected: both halves measured, a failing one bisected again,
two passing ones searched across the cut. A group's all-reduce ring only uses neighbouring links, so the measuring
side must also exercise every pair (the runner adds a small all-to-all) for a pair fault to show in any group.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["pass", "fail", "unknown"]
Shape = Literal["local", "slow", "pair", "unresolved"]
Group = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Figures:
    """What measuring one group gave: bus bandwidth (nccl-tests' busbw), small-message latency, or an error."""

    busbw_gbps: float | None = None
    latency_us: float | None = None
    error: str | None = None
    seconds: float | None = None  # how long measuring it took, start-up included


@dataclass(frozen=True, slots=True)
class Criteria:
    slow_share: float = 0.3  # a pair this far below the pairs' median bandwidth (or above their latency) is slow
    local_share: float = 0.15  # a node's GEMM or local all-reduce this far below the allocation's median fails
    min_busbw_gbps: float | None = None  # the fleet's floor for any group (from the service, or by hand)
    max_latency_us: float | None = None
    # The fleet's cut-offs for a node's own figures (`gemm_tflops`, `allreduce_node_gbps`): ml/check_criteria.py's,
    # as the service serves them for the nodes' GPU model.
    local_floors: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LocalReport:
    """One node's own checks: what failed on it already (the check suite's and the fleet's verdicts), and the
    figures the allocation's nodes are compared on (the lowest GPU's GEMM TFLOPS, the local all-reduce busbw)."""

    node: str
    failures: tuple[str, ...] = ()
    figures: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Measured:
    nodes: Group
    verdict: Verdict
    why: str
    figures: Mapping[str, float] = field(default_factory=dict)
    ref: str | None = None  # the known-good node added to a single suspect


@dataclass(slots=True)
class Round:
    index: int
    phase: str
    groups: list[Measured]
    seconds: float | None = None  # how long the round's measuring took (for people; nothing decides on it)
    ended_at: str | None = None  # ISO time, where the caller keeps one (on_round)


@dataclass(frozen=True, slots=True)
class Named:
    node: str
    shape: Shape
    why: str
    peer: str | None = None
    rounds: tuple[int, ...] = ()  # the rounds whose failing groups held it


@dataclass(slots=True)
class Outcome:
    nodes: list[str]
    rounds: list[Round]
    named: list[Named]  # bad nodes: local, slow, pair
    unresolved: list[Named]  # failures the search could not pin on a node (nobody is named for them)
    measurements: int
    complete: bool  # False when `stop` ended the search early

    @property
    def bad(self) -> list[str]:
        return sorted({n.node for n in self.named})


@dataclass(frozen=True, slots=True)
class _Probe:
    nodes: Group
    ref: bool = False  # a single node: the driver adds one known-good node


Measure = Callable[[list[Group]], list[Figures]]
Step = Generator[list[_Probe], list[Measured], None]


class Stopped(Exception):
    """The caller's time ran out."""


def probe_timeout(finished: Sequence[float], *, ceiling: float, floor: float = 10.0, factor: float = 3.0) -> float:
    """How long a group may take: `factor` times the slowest group that finished without an error so far (a group
    of this allocation, this size of message, these start-up costs), within [floor, ceiling]. A broken link often
    hangs rather than errs; the bisection across it measures several failing groups, each costing this long."""
    if not finished:
        return ceiling
    return min(ceiling, max(floor, factor * max(finished)))


def halves(group: Sequence[str]) -> tuple[Group, Group]:
    cut = (len(group) + 1) // 2
    return tuple(group[:cut]), tuple(group[cut:])


def judge_local(reports: Mapping[str, LocalReport], criteria: Criteria) -> dict[str, str]:
    """Node -> why it fails its own checks: a failure it reported, or a figure this far below the allocation's
    median (three nodes or more: a GPU slower than its identical neighbours, as compute.py judges GPUs of a node)."""
    failed = {node: "; ".join(r.failures) for node, r in reports.items() if r.failures}
    for node, r in reports.items():
        below = [
            f"{name} {r.figures[name]:.4g} below the fleet's {floor:.4g}"
            for name, floor in sorted(criteria.local_floors.items())
            if name in r.figures and r.figures[name] < floor
        ]
        if below and node not in failed:
            failed[node] = "; ".join(below)
    names = sorted({key for r in reports.values() for key in r.figures})
    for name in names:
        values = {node: r.figures[name] for node, r in reports.items() if name in r.figures}
        if len(values) < 3:
            continue
        median = statistics.median(values.values())
        cutoff = median * (1 - criteria.local_share)
        for node, value in values.items():
            if value < cutoff and node not in failed:
                failed[node] = f"{name} {value:.4g} below {cutoff:.4g} ({1 - criteria.local_share:g} x the median)"
    return failed


class _Search:
    def __init__(
        self, measure: Measure, criteria: Criteria, stop: Callable[[], bool], on_round: Callable[[Round], None]
    ):
        self.measure, self.criteria, self.stop, self.on_round = measure, criteria, stop, on_round
        self.rounds: list[Round] = []
        self.named: list[Named] = []
        self.good: set[str] = set()  # members of a passing group: usable as a known-good reference
        self.reference: tuple[float | None, float | None] = (None, None)  # the pairs' median busbw, latency
        self.failed_in: dict[str, list[int]] = {}
        self.measurements = 0

    # -- one round ----------------------------------------------------------------------------------------

    def run_round(self, phase: str, probes: list[_Probe], *, sets_reference: bool = False) -> list[Measured]:
        if self.stop():
            raise Stopped
        index = len(self.rounds) + 1
        busy = {n for p in probes for n in p.nodes}
        spare = sorted(self.good - busy - self.bad_nodes())
        groups: list[Group | None] = []
        refs: list[str | None] = []
        for probe in probes:
            ref = spare.pop(0) if probe.ref and spare else None
            refs.append(ref)
            groups.append(None if probe.ref and ref is None else probe.nodes + ((ref,) if ref else ()))
        measured = [g for g in groups if g is not None]
        started = time.monotonic()
        figures = iter(self.measure(measured) if measured else [])
        took = round(time.monotonic() - started, 2)
        self.measurements += len(measured)
        raw = [(g, next(figures) if g is not None else None) for g in groups]
        if sets_reference:
            self.reference = _reference([f for g, f in raw if g is not None and len(g) == 2 and f is not None])
        out: list[Measured] = []
        for probe, ref, (group, fig) in zip(probes, refs, raw, strict=True):
            if group is None or fig is None:
                out.append(Measured(probe.nodes, "unknown", "no known-good node free to measure it with"))
                continue
            verdict, why = self.judge(group, fig)
            out.append(Measured(group, verdict, why, _figures(fig), ref))
            if verdict == "pass":
                self.good.update(group)
            else:
                for node in probe.nodes:
                    self.failed_in.setdefault(node, []).append(index)
        done = Round(index, phase, out, took)
        self.rounds.append(done)
        self.on_round(done)
        return out

    def judge(self, group: Group, fig: Figures) -> tuple[Verdict, str]:
        c = self.criteria
        if fig.error:
            return "fail", f"error: {fig.error}"
        if fig.busbw_gbps is None:
            return "fail", "no figure"
        if c.min_busbw_gbps is not None and fig.busbw_gbps < c.min_busbw_gbps:
            return "fail", f"busbw {fig.busbw_gbps:.4g} GB/s below the floor {c.min_busbw_gbps:.4g}"
        if c.max_latency_us is not None and fig.latency_us is not None and fig.latency_us > c.max_latency_us:
            return "fail", f"latency {fig.latency_us:.4g} us above the ceiling {c.max_latency_us:.4g}"
        bw, lat = self.reference
        # Small groups against the pairs only (a trio is the first round's odd node out): bus bandwidth and latency
        # of bigger groups also depend on the topology.
        small = len(group) <= 3
        if small and bw is not None and fig.busbw_gbps < bw * (1 - c.slow_share):
            return "fail", f"slow: busbw {fig.busbw_gbps:.4g} GB/s < {1 - c.slow_share:g} x the pairs' {bw:.4g}"
        if small and lat is not None and fig.latency_us is not None and fig.latency_us > lat / (1 - c.slow_share):
            return "fail", f"slow: latency {fig.latency_us:.4g} us > the pairs' {lat:.4g} / {1 - c.slow_share:g}"
        return "pass", "ok"

    def bad_nodes(self) -> set[str]:
        return {n.node for n in self.named if n.shape != "unresolved"}

    def name(self, node: str, shape: Shape, why: str, peer: str | None = None) -> None:
        self.named.append(Named(node, shape, why, peer, tuple(self.failed_in.get(node, ()))))

    # -- searches, as generators: each yields the probes of its next round and receives their results ------------

    def drive(self, phase: str, steps: list[Step]) -> None:
        """Run searches side by side, every round's probes of all of them measured at once (their nodes are
        disjoint: each search works inside its own failed group)."""
        together = _side_by_side(steps)
        try:
            probes = next(together)
            while True:
                probes = together.send(self.run_round(phase, probes))
        except StopIteration:
            return

    def bisect(self, group: Group, halves_passed: tuple[Group, Group] | None = None) -> Step:
        """Name the bad nodes of a group that failed."""
        if len(group) == 1:
            [single] = yield [_probe(group)]
            yield from self.confirm(group[0], single)
            return
        if halves_passed is not None:
            yield from self.cut(*halves_passed)
            return
        left, right = halves(group)
        results = yield [_probe(left), _probe(right)]
        failed = [(half, r) for half, r in zip((left, right), results, strict=True) if r.verdict != "pass"]
        if not failed:
            yield from self.cut(left, right)
            return
        deeper = [self.confirm(half[0], r) if len(half) == 1 else self.bisect(half) for half, r in failed]
        yield from _side_by_side(deeper)

    def confirm(self, node: str, first: Measured) -> Step:
        """A node measured alone with a known-good one: slow twice is named; slow once and fine the second time was
        the moment's (a busy link, a host's shared cores), not the node's, and is not named."""
        if first.verdict != "fail":
            self.name(node, "unresolved", f"failed in a group, {first.why}")
            return
        [again] = yield [_probe((node,))]
        if again.verdict == "fail":
            self.name(node, "slow", f"{first.why} (with known-good {first.ref}; again with {again.ref})")
        elif again.verdict == "unknown":
            self.name(node, "unresolved", f"{first.why} once, not measured again: {again.why}")

    def cut(self, a: Group, b: Group) -> Step:
        """a and b each pass alone and fail together: a bad link between one node of each. While both sides have
        two nodes or more, both are halved at once and the halves crossed, two disjoint groups a round (a1+b1 with
        a2+b2, then a1+b2 with a2+b1): the failing one holds the link, so each step halves both sides with one
        failing group, the cost of a hang. Once one side is a single node, the other is halved alone (its two halves
        would share that node); the half that fails with it holds the other end."""
        last: Measured | None = None  # the last failing group, if it was exactly a + b
        while len(a) > 1 and len(b) > 1:
            (a1, a2), (b1, b2) = halves(a), halves(b)
            found = None
            for crossed in (((a1, b1), (a2, b2)), ((a1, b2), (a2, b1))):
                results = yield [_Probe(x + y) for x, y in crossed]
                found = next(((xy, r) for xy, r in zip(crossed, results, strict=True) if r.verdict == "fail"), None)
                if found is not None:
                    break
            if found is None:
                self.name(a[0], "unresolved", f"{len(a) + len(b)} nodes failed together, no part of them did", b[0])
                return
            (a, b), last = found
        while len(a) > 1 or len(b) > 1:
            halve_a = len(a) > 1
            first, second = halves(a if halve_a else b)
            [r] = yield [_Probe(first + b if halve_a else a + first)]
            pick = first if r.verdict == "fail" else second  # else the other half: a and b failed together
            a, b = (pick, b) if halve_a else (a, pick)
            last = r if r.verdict == "fail" else None
        if last is None:
            [last] = yield [_Probe(a + b)]
            if last.verdict != "fail":
                self.name(a[0], "unresolved", f"with {b[0]}: failed only in bigger groups ({last.why} alone)", b[0])
                return
        why = f"the link between them: {last.why}; each passes with other nodes"
        self.name(a[0], "pair", why, b[0])
        self.name(b[0], "pair", why, a[0])


def _side_by_side(steps: list[Step]) -> Step:
    """Several searches inside one, their probes of a round together."""
    live: list[tuple[Step, list[_Probe]]] = []
    for step in steps:
        with contextlib.suppress(StopIteration):
            live.append((step, next(step)))
    while live:
        results = yield [p for _, probes in live for p in probes]
        following: list[tuple[Step, list[_Probe]]] = []
        at = 0
        for step, probes in live:
            part, at = results[at : at + len(probes)], at + len(probes)
            with contextlib.suppress(StopIteration):
                following.append((step, step.send(part)))
        live = following


def _probe(group: Group) -> _Probe:
    return _Probe(group, ref=len(group) == 1)


def _reference(figures: list[Figures]) -> tuple[float | None, float | None]:
    """The pairs' median bandwidth and latency: two pairs or more, so that one slow pair cannot be its own yardstick."""
    bws = [f.busbw_gbps for f in figures if not f.error and f.busbw_gbps is not None]
    lats = [f.latency_us for f in figures if not f.error and f.latency_us is not None]
    return (statistics.median(bws) if len(bws) >= 2 else None, statistics.median(lats) if len(lats) >= 2 else None)


def _figures(fig: Figures) -> dict[str, float]:
    out = {}
    if fig.busbw_gbps is not None:
        out["busbw_gbps"] = round(fig.busbw_gbps, 3)
    if fig.latency_us is not None:
        out["latency_us"] = round(fig.latency_us, 1)
    return out


def search(
    nodes: Sequence[str],
    measure: Measure,
    *,
    local: Mapping[str, LocalReport] | None = None,
    criteria: Criteria | None = None,
    stop: Callable[[], bool] = lambda: False,
    on_round: Callable[[Round], None] = lambda _: None,
    verify_rounds: int = 3,
) -> Outcome:
    """The whole preflight search over an allocation's nodes (in the scheduler's order)."""
    s = _Search(measure, criteria or Criteria(), stop, on_round)
    order = list(dict.fromkeys(nodes))
    complete = True
    try:
        if local:
            failed = judge_local(local, s.criteria)
            groups = [
                Measured((n,), "fail" if n in failed else "pass", failed.get(n, "ok"), dict(local[n].figures))
                for n in order
                if n in local
            ]
            done = Round(1, "local", groups)
            s.rounds.append(done)
            on_round(done)
            for node in order:
                if node in failed:
                    s.name(node, "local", failed[node])
        _cross_node(s, [n for n in order if n not in s.bad_nodes()], verify_rounds)
    except Stopped:
        complete = False
    named = [n for n in s.named if n.shape != "unresolved"]
    unresolved = [n for n in s.named if n.shape == "unresolved"]
    return Outcome(order, s.rounds, named, unresolved, s.measurements, complete)


def _cross_node(s: _Search, healthy: list[str], verify_rounds: int) -> None:
    if len(healthy) < 2:
        return
    # Level 1: disjoint pairs at once (an odd node joins the last pair); their median is the yardstick.
    pairs = [tuple(healthy[i : i + 2]) for i in range(0, len(healthy) - len(healthy) % 2, 2)]
    if len(healthy) % 2:
        pairs[-1] = pairs[-1] + (healthy[-1],)
    results = s.run_round("pairs", [_Probe(p) for p in pairs], sets_reference=True)
    s.drive("bisect", [s.bisect(p) for p, r in zip(pairs, results, strict=True) if r.verdict != "pass"])
    # (group without the named nodes, whether it passed as it is)
    level = [(_without(p, s.bad_nodes()), r.verdict == "pass") for p, r in zip(pairs, results, strict=True)]
    level = [(g, ok) for g, ok in level if g]
    size = 2
    while len(level) > 1:
        size *= 2
        merged = [(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        carried = [level[-1]] if len(level) % 2 else []
        results = s.run_round(f"groups of {size}", [_Probe(a[0] + b[0]) for a, b in merged])
        s.drive(
            "bisect",
            [
                s.bisect(a[0] + b[0], (a[0], b[0]) if a[1] and b[1] else None)
                for (a, b), r in zip(merged, results, strict=True)
                if r.verdict != "pass"
            ],
        )
        bad = s.bad_nodes()
        level = [
            (g, r.verdict == "pass")
            for (a, b), r in zip(merged, results, strict=True)
            if (g := _without(a[0] + b[0], bad))
        ] + carried
    # The whole allocation less the named nodes, measured again if it has not passed as it is.
    rest, ok = level[0] if level else ((), True)
    for _ in range(verify_rounds):
        if ok or len(rest) < 2:
            return
        [r] = s.run_round("verify", [_Probe(rest)])
        if r.verdict == "pass":
            return
        before = len(s.named)
        s.drive("bisect", [s.bisect(rest)])
        if len(s.named) == before:
            return
        rest, ok = _without(rest, s.bad_nodes()), False


def _without(group: Group, bad: set[str]) -> Group:
    return tuple(n for n in group if n not in bad)
