"""One snapshot of every rank's stack: groups, the dominant one, and the culprits the others wait for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ml import parallel
from ml.findings import JobInfo, StackSample
from ml.stacks.frames import (
    _CODE,
    _EVIDENCE_SIGNALS,
    _MAX_RANK,
    _NO_STACK,
    _UNREPORTED,
    COLLECTIVE,
    COMPUTE,
    DATA,
    MAX_TREE_DEPTH,
    NO_STACK,
    OTHER,
    _Normalizer,
    _short_ranges,
    _Snapshot,
    _snapshot,
    rank_ranges,
)


@dataclass(frozen=True, slots=True)
class StackGroup:
    """Ranks sharing one normalized stack."""

    signature: str
    state: str  # collective, data, compute, other, or no_stack
    op: str  # the innermost meaningful frame
    ranks: str  # compact ranges, "0-6,8-15"
    count: int
    nodes: list[str]
    frames: list[str]  # representative normalized frames, innermost first


@dataclass(frozen=True, slots=True)
class StackAnalysis:
    """What the stacks of one snapshot say: groups, the healthy one, the culprits and the machines to blame."""

    groups: list[StackGroup]
    dominant: str | None  # signature of the largest group
    dominant_state: str | None
    culprit_ranks: list[int]
    suspects: list[tuple[str, float, str]]  # (node, confidence, why), most likely first
    method: str  # named, group_fallback, inconclusive
    why: str
    tree: dict[str, Any]
    covering_group: tuple[str, list[int]] | None = None
    ranks_reporting: int = 0
    unreported: str = ""  # ranks of the job with no sample at all (their agents have not answered)
    culprit_frames: list[str] = field(default_factory=list)
    culprit_state: str | None = None
    culprit_sample_ids: list[int] = field(default_factory=list)
    outlier_sample_ids: list[int] = field(default_factory=list)
    sample_ids: int = 0  # how many samples carried an id


_PHRASE = {
    DATA: "in data loading",
    COMPUTE: "in compute",
    OTHER: "outside any collective",
    COLLECTIVE: "in a collective",
    NO_STACK: "without a stack (process gone or dump failed)",
}


def _groups(snap: _Snapshot, norm: _Normalizer) -> list[tuple[int, np.ndarray]]:
    """(signature index or -1 for no stack, ranks) for every group present, largest first."""
    ranks = np.flatnonzero(snap.sig >= _NO_STACK)
    keys = snap.sig[ranks]
    order = np.argsort(keys, kind="stable")
    keys, ranks = keys[order], ranks[order]
    cuts = np.flatnonzero(np.diff(keys)) + 1
    out = [(int(k[0]), r) for k, r in zip(np.split(keys, cuts), np.split(ranks, cuts), strict=True) if k.size]

    def rank_key(item: tuple[int, np.ndarray]) -> tuple[int, int, str]:
        index, members = item
        waiting = 0 if index >= 0 and norm.sigs[index].cls.state == COLLECTIVE else 1
        return -members.size, waiting, norm.sigs[index].signature if index >= 0 else "~"

    return sorted(out, key=rank_key)


def _group_view(index: int, members: np.ndarray, snap: _Snapshot, norm: _Normalizer) -> StackGroup:
    nodes = sorted({snap.node_names[n] for n in np.unique(snap.node[members]).tolist() if n >= 0})
    if index < 0:
        return StackGroup("none", NO_STACK, "(no stack)", rank_ranges(members), int(members.size), nodes, [])
    sig = norm.sigs[index]
    return StackGroup(
        sig.signature, sig.cls.state, sig.cls.op, rank_ranges(members), int(members.size), nodes, sig.labels
    )


@dataclass(slots=True)
class _Verdict:
    culprits: np.ndarray
    basis: str  # elsewhere, no_stack, partner, absent, stuck_group, stuck_p2p, none
    detail: str


def _partners_p2p(job: JobInfo, snap: _Snapshot, norm: _Normalizer, p2p_ranks: np.ndarray) -> np.ndarray:
    """Pipeline neighbours that point-to-point waiters talk to and that are not in a point-to-point op."""
    lay = parallel.layout(job)
    if lay.sizes["pp"] < 2 or p2p_ranks.size == 0:
        return np.empty(0, dtype=np.int64)
    direction = np.array([s.cls.p2p for s in norm.sigs], dtype=np.int64)[snap.sig[p2p_ranks]]
    prev, nxt = parallel.pipeline_neighbours_array(lay, p2p_ranks)
    wanted = np.concatenate((prev[(direction & 1) > 0], nxt[(direction & 2) > 0]))
    wanted = wanted[(wanted >= 0) & (wanted < snap.sig.size)]
    wanted = np.unique(wanted)
    in_p2p = np.zeros(snap.sig.size, dtype=bool)
    in_p2p[p2p_ranks] = True
    reporting = snap.sig[wanted] >= _NO_STACK
    return wanted[reporting & ~in_p2p[wanted]]


def _absent_peers(job: JobInfo, snap: _Snapshot, members: np.ndarray) -> tuple[np.ndarray, str | None]:
    """Ranks of the parallel groups a collective's waiters belong to that are not in it: they never arrived.

    The group the collective runs in is the dimension whose groups the waiters almost fill; when they fill
    them completely, everyone arrived and the group itself is stuck (returned as the waiters, dimension named).
    """
    lay = parallel.layout(job)
    reporting = np.flatnonzero(snap.sig >= _NO_STACK)
    inside = np.zeros(snap.sig.size, dtype=bool)
    inside[members] = True
    best: tuple[int, str, np.ndarray] | None = None
    for dim in parallel.DIMS:
        if lay.sizes[dim] < 2:
            continue
        ids = parallel.group_id_array(lay, reporting, dim)
        touched = np.isin(ids, np.unique(parallel.group_id_array(lay, members, dim)))
        absent = reporting[touched & ~inside[reporting]]
        if best is None or absent.size < best[0]:
            best = (int(absent.size), dim, absent)
    if best is None:
        return np.empty(0, dtype=np.int64), None
    return best[2], best[1]


def _verdict(job: JobInfo, snap: _Snapshot, norm: _Normalizer, dominant: int) -> _Verdict:
    reporting = snap.sig >= _NO_STACK
    outlier = reporting & (snap.sig != dominant)
    no_stack = snap.sig == _NO_STACK
    elsewhere = outlier & (snap.state >= 0) & (snap.state != _CODE[COLLECTIVE])
    dom_state = norm.sigs[dominant].cls.state
    empty = np.empty(0, dtype=np.int64)
    if not outlier.any():
        return _Verdict(empty, "none", "every rank shares one stack")
    if dom_state != COLLECTIVE:
        # Nobody visibly waits: ranks elsewhere than the majority are suspects only when they are few.
        few = max(1, int(0.25 * reporting.sum()))
        if 0 < elsewhere.sum() <= few:
            return _Verdict(np.flatnonzero(elsewhere), "elsewhere", "")
        if 0 < no_stack.sum() <= few:
            return _Verdict(np.flatnonzero(no_stack), "no_stack", "")
        return _Verdict(empty, "none", "no small set of ranks stands apart from the majority")
    if elsewhere.any():
        culprits = elsewhere.copy()
        # A dead process on a culprit's machine is the same story; elsewhere it is only a failed dump.
        culprit_nodes = np.unique(snap.node[elsewhere])
        culprits |= no_stack & np.isin(snap.node, culprit_nodes[culprit_nodes >= 0])
        return _Verdict(np.flatnonzero(culprits), "elsewhere", "")
    # Failed dumps point at their machines only while most dumps worked (py-spy itself may be broken).
    if no_stack.any() and no_stack.sum() * 2 < reporting.sum():
        return _Verdict(np.flatnonzero(no_stack), "no_stack", "")
    return _collective_outliers(job, snap, norm, outlier)


def _collective_outliers(job: JobInfo, snap: _Snapshot, norm: _Normalizer, outlier: np.ndarray) -> _Verdict:
    """Outliers all wait in other collectives: find the peers they wait for."""
    p2p_sig = np.array([s.cls.p2p > 0 for s in norm.sigs] + [False, False], dtype=bool)
    is_p2p = outlier & p2p_sig[snap.sig]
    partners = _partners_p2p(job, snap, norm, np.flatnonzero(is_p2p))
    culprits: list[np.ndarray] = [partners] if partners.size else []
    details: list[str] = []
    if partners.size:
        waiters = np.flatnonzero(is_p2p)
        p2p_op = _fn(norm.sigs[int(snap.sig[waiters[0]])].cls.op)
        details.append(f"ranks {_short_ranges(waiters, 6)} wait in {p2p_op} for pipeline peers that never came")
    stuck: list[np.ndarray] = []
    # Waiters of one operation belong together whatever call path brought them there.
    others = np.flatnonzero(outlier & ~is_p2p & (snap.sig >= 0))
    ops = np.array([s.cls.op for s in norm.sigs], dtype=object)[snap.sig[others]] if others.size else []
    for op in sorted(set(ops)):
        members = others[ops == op]
        absent, dim = _absent_peers(job, snap, members)
        if absent.size:
            culprits.append(absent)
            details.append(f"ranks {_short_ranges(members, 6)} wait in {_fn(op)} for {dim} peers that never came")
        elif dim is not None:
            stuck.append(members)
            details.append(
                f"ranks {_short_ranges(members, 6)} all reached {_fn(op)} in their {dim} group and are stuck"
            )
    if culprits:
        return _Verdict(np.unique(np.concatenate(culprits)), "partner", "; ".join(details))
    if stuck:
        return _Verdict(np.unique(np.concatenate(stuck)), "stuck_group", "; ".join(details))
    if is_p2p.any():
        detail = "point-to-point pairs wait for each other"
        return _Verdict(np.flatnonzero(is_p2p), "stuck_p2p", detail)
    return _Verdict(np.empty(0, dtype=np.int64), "none", "outliers wait in other collectives; no peer stands out")


_BASE_CONFIDENCE = {"elsewhere": 0.9, "no_stack": 0.85, "partner": 0.8, "stuck_group": 0.75, "stuck_p2p": 0.7}


def _fn(label: str) -> str:
    """The function of a frame label: 'all_reduce (torch/distributed/distributed_c10d.py)' -> 'all_reduce'."""
    return label.split(" (", 1)[0]


def _doing(index: int, norm: _Normalizer) -> str:
    """'wait in all_reduce', 'in data loading (_get_data)', 'without a stack (...)'."""
    if index < 0:
        return _PHRASE[NO_STACK]
    cls = norm.sigs[index].cls
    return f"in {_fn(cls.op)}" if cls.state == COLLECTIVE else f"{_PHRASE[cls.state]} ({_fn(cls.op)})"


def _describe(ranks: np.ndarray, snap: _Snapshot, norm: _Normalizer) -> str:
    """'rank 3 in data loading (_stuck_in_data_loading)' for culprits (the first one's state stands for all)."""
    first = int(ranks[0])
    who = f"rank {first}" if ranks.size == 1 else f"ranks {_short_ranges(ranks, 6)}"
    return f"{who} {_doing(int(snap.sig[first]), norm)}"


def _suspects(
    job: JobInfo, snap: _Snapshot, norm: _Normalizer, verdict: _Verdict, dominant: int
) -> tuple[str, list[tuple[str, float, str]], tuple[str, list[int]] | None, str]:
    """(method, suspects, covering group, why) for the verdict's culprits."""
    culprits = verdict.culprits
    dom = norm.sigs[dominant]
    reporting = int((snap.sig >= _NO_STACK).sum())
    waiting = (
        f"{int((snap.sig == dominant).sum())} of {reporting} ranks {'wait ' if dom.cls.state == COLLECTIVE else 'are '}"
    )
    waiting += _doing(dominant, norm)
    if culprits.size == 0:
        return "inconclusive", [], None, f"{verdict.detail}; {waiting}"
    base = _BASE_CONFIDENCE.get(verdict.basis, 0.7) - (0.15 if dom.cls.state != COLLECTIVE else 0.0)
    node_of = snap.node[culprits]
    nodes = np.unique(node_of[node_of >= 0])
    per_node = [(snap.node_names[n], culprits[node_of == n]) for n in nodes.tolist()]
    job_nodes = int(np.unique(snap.node[snap.node >= 0]).size)
    # Every reporting rank of each machine is a culprit: whole machines failed, which separates them too.
    on_node = np.bincount(snap.node[(snap.sig >= _NO_STACK) & (snap.node >= 0)], minlength=len(snap.node_names))
    culprits_on_node = np.bincount(node_of[node_of >= 0], minlength=len(snap.node_names))
    whole = bool(np.all(on_node[nodes] == culprits_on_node[nodes]))
    if nodes.size == 1 or (whole and nodes.size <= max(2, math.ceil(0.05 * job_nodes))):
        confidence = round(base - (0.05 if nodes.size > 1 else 0.0), 2)
        suspects = [(name, confidence, _why(verdict, _describe(r, snap, norm), waiting)) for name, r in per_node]
        return "named", suspects, None, suspects[0][2] if len(suspects) == 1 else f"{len(suspects)} whole machines"
    covering = parallel.smallest_group_covering(job, culprits.tolist())
    if covering is not None:
        members = np.asarray([r for r in covering[1] if r < snap.sig.size], dtype=np.int64)
        group_nodes = sorted({int(n) for n in snap.node[members].tolist() if n >= 0})
        if len(members) < reporting and parallel.nameable_group(len(group_nodes), job_nodes):
            hosting = set(nodes.tolist())
            why = f"{_why(verdict, _describe(culprits, snap, norm), waiting)}; they span {nodes.size} machines,"
            why += f" the smallest parallel group covering them is {covering[0]} group {_short_ranges(covering[1], 6)}"
            suspects = [
                (snap.node_names[n], 0.7 if n in hosting else 0.6, why if n in hosting else f"in the same group: {why}")
                for n in sorted(group_nodes, key=lambda n: (n not in hosting, snap.node_names[n]))
            ]
            return "group_fallback", suspects, covering, why
    why = f"{_why(verdict, _describe(culprits, snap, norm), waiting)}; they span {nodes.size} machines"
    return "inconclusive", [], covering, why + " and no small parallel group covers them"


def _why(verdict: _Verdict, culprits: str, waiting: str) -> str:
    """One sentence a person reads: who is where, and what the others do meanwhile."""
    if verdict.basis in ("elsewhere", "no_stack"):
        return f"{culprits} while {waiting}"
    if verdict.basis == "partner":
        return f"{verdict.detail}: {culprits}"
    return f"{verdict.detail}; {waiting}"


def _tree(snap: _Snapshot, norm: _Normalizer, keep: set[int], total: int) -> dict[str, Any]:
    """All ranks' stacks merged outermost-first, pruned: tiny branches go unless they lead to an outlier."""
    root: dict[str, Any] = {"name": "all ranks", "count": 0, "children": {}, "keep": True}
    counts = np.bincount(snap.sig[snap.sig >= 0], minlength=len(norm.sigs)) if norm.sigs else np.zeros(0, int)
    for index in np.flatnonzero(counts).tolist():
        labels = norm.sigs[index].labels[::-1]
        if len(labels) > MAX_TREE_DEPTH:  # keep both ends: the entry point and where the rank is
            head, tail = MAX_TREE_DEPTH // 4, MAX_TREE_DEPTH - MAX_TREE_DEPTH // 4 - 1
            labels = [*labels[:head], f"... {len(labels) - head - tail} frames ...", *labels[-tail:]]
        _insert(root, labels, int(counts[index]), index in keep)
    missing = int((snap.sig == _NO_STACK).sum())
    if missing:
        _insert(root, ["(no stack)"], missing, _NO_STACK in keep)
    return _prune(root, min_count=max(2, math.ceil(0.005 * total)))


def _insert(root: dict[str, Any], labels: list[str], count: int, keep: bool) -> None:
    node = root
    node["count"] += count
    for label in labels:
        child = node["children"].get(label)
        if child is None:
            child = node["children"][label] = {"name": label, "count": 0, "children": {}, "keep": False}
        child["count"] += count
        child["keep"] = child["keep"] or keep
        node = child


def _prune(node: dict[str, Any], *, min_count: int, max_children: int = 12) -> dict[str, Any]:
    children = sorted(node["children"].values(), key=lambda c: (-c["count"], c["name"]))
    kept = [c for i, c in enumerate(children) if c["keep"] or (c["count"] >= min_count and i < max_children)]
    out: dict[str, Any] = {"name": node["name"], "count": node["count"]}
    out["children"] = [_prune(c, min_count=min_count, max_children=max_children) for c in kept]
    rest = sum(c["count"] for c in children) - sum(c["count"] for c in kept)
    if rest > 0:
        other = {"name": f"(other, {len(children) - len(kept)} branches)", "count": rest, "children": []}
        out["children"].append(other)
    return out


def _ids(snap: _Snapshot, ranks: np.ndarray) -> list[int]:
    out = []
    for rank in ranks.tolist():
        pos = int(snap.sample_pos[rank])
        if pos >= 0 and snap.samples[pos].id is not None:
            out.append(int(snap.samples[pos].id))
    return out


def _empty(why: str, unreported: str = "") -> StackAnalysis:
    tree: dict[str, Any] = {"name": "all ranks", "count": 0, "children": []}
    return StackAnalysis([], None, None, [], [], "inconclusive", why, tree, unreported=unreported)


def _unreported(job: JobInfo, snap: _Snapshot) -> str:
    """Ranks the job has (world size or rank map) that sent no sample."""
    world = job.world_size or max((r + 1 for r in job.rank_nodes if isinstance(r, int)), default=0)
    world = min(int(world), _MAX_RANK)
    missing = np.ones(world, dtype=bool)
    seen = np.flatnonzero(snap.sig[:world] != _UNREPORTED)
    missing[seen] = False
    return rank_ranges(np.flatnonzero(missing))


def _analyze(job: JobInfo, snap: _Snapshot, norm: _Normalizer) -> StackAnalysis:
    groups = _groups(snap, norm)
    unreported = _unreported(job, snap)
    stacked = [(i, r) for i, r in groups if i >= 0]
    if not stacked:
        return _empty("no rank has a readable stack", unreported)
    dominant = stacked[0][0]
    verdict = _verdict(job, snap, norm, dominant)
    method, suspects, covering, why = _suspects(job, snap, norm, verdict, dominant)
    reporting = snap.sig >= _NO_STACK
    outliers = np.flatnonzero(reporting & (snap.sig != dominant))
    culprits = verdict.culprits
    # The tree keeps the culprits' branches however thin; with no culprit, a few outlier branches instead.
    keep = {int(i) for i in np.unique(snap.sig[culprits]).tolist()} | {dominant}
    outlier_sigs = np.unique(snap.sig[outliers]).tolist()
    if not culprits.size and len(outlier_sigs) <= 16:
        keep |= {int(i) for i in outlier_sigs}
    first = int(snap.sig[culprits[0]]) if culprits.size else None
    culprit_ids = _ids(snap, culprits[:_EVIDENCE_SIGNALS])
    outlier_ids = _ids(snap, np.setdiff1d(outliers, culprits)[: max(0, _EVIDENCE_SIGNALS - len(culprit_ids))])
    return StackAnalysis(
        groups=[_group_view(i, r, snap, norm) for i, r in groups],
        dominant=norm.sigs[dominant].signature,
        dominant_state=norm.sigs[dominant].cls.state,
        culprit_ranks=culprits.tolist(),
        suspects=suspects,
        method=method,
        why=why,
        tree=_tree(snap, norm, keep, int(reporting.sum())),
        covering_group=covering,
        ranks_reporting=int(reporting.sum()),
        unreported=unreported,
        culprit_frames=norm.sigs[first].labels if first is not None and first >= 0 else [],
        culprit_state=(norm.sigs[first].cls.state if first >= 0 else NO_STACK) if first is not None else None,
        culprit_sample_ids=culprit_ids,
        outlier_sample_ids=outlier_ids,
        sample_ids=len(snap.samples) - [s.id for s in snap.samples].count(None),
    )


def analyze(job: JobInfo, stacks: list[StackSample]) -> StackAnalysis:
    """Group one snapshot of every rank's stack and localize the rank and machine the others wait for."""
    norm = _Normalizer()
    return _analyze(job, _snapshot(job, stacks or [], norm), norm)
