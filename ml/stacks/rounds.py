"""Fail-slow: stacks taken in rounds seconds apart, and the ranks that stand apart round after round."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from ml import parallel
from ml.findings import Finding, JobInfo, StackRoundsEvidence, StackSample
from ml.stacks.analysis import _doing
from ml.stacks.frames import (
    _CODE,
    _EVIDENCE_SIGNALS,
    _NO_STACK,
    _UNREPORTED,
    COLLECTIVE,
    MAX_TREE_DEPTH,
    _Normalizer,
    _short_ranges,
    _Snapshot,
    _snapshot,
    rank_ranges,
)
from ml.stacks.report import _findings, _key


@dataclass(frozen=True, slots=True)
class RoundsAnalysis:
    """Stacks taken in rounds seconds apart: the ranks outside the collective in most rounds are stragglers."""

    rounds: int
    informative_rounds: int  # rounds with one clear majority stack
    stragglers: list[int]
    out_counts: dict[int, int]  # rounds each rank stood apart in (the most frequent 50 ranks)
    suspects: list[tuple[str, float, str]]
    method: str  # named, group_fallback, inconclusive
    why: str
    dominant_states: list[str | None]  # per round
    straggler_frames: list[str] = field(default_factory=list)
    straggler_sample_ids: list[int] = field(default_factory=list)
    covering_group: tuple[str, list[int]] | None = None
    # Ranks apart often enough that more rounds could settle them, when none is significant yet.
    leading: list[int] = field(default_factory=list)


_ALPHA = 0.01  # chance that noise alone makes any rank of the job look consistently out
_BASE_RATE_FLOOR = 0.02  # healthy ranks are caught outside the collective at least this often
# A rank apart in this share of the rounds (and in two at least) but not yet significant is worth more rounds:
# a straggler that computes most of a step is still caught beside a computing peer now and then.
_LEAD_SHARE = 0.4
_LEAD_CHANCE = 0.25  # not yet beyond chance, but unlikely enough that more rounds may settle it


def _round_out(snap: _Snapshot, norm: _Normalizer, usual: int) -> tuple[np.ndarray | None, str | None]:
    """Per rank: apart from the ranks dumped beside it in this round; None when the round tells nothing.

    Agents dump when their directive reaches them, so machines are caught at different moments of a step:
    a rank is compared first with the ranks of its own machine (dumped at the same moment), and only a rank
    alone on its machine with the whole round. A tie inside a machine is settled by the job's usual stack.
    """
    counts = np.bincount(snap.sig[snap.sig >= 0], minlength=len(norm.sigs))
    if counts.size == 0 or counts.max() == 0:
        return None, None
    top = np.flatnonzero(counts == counts.max())
    dominant = int(top[0]) if top.size == 1 else -1
    reporting = snap.sig >= _NO_STACK
    state = norm.sigs[dominant].cls.state if dominant >= 0 else None
    if dominant >= 0:
        # When the rest wait in a collective, what matters is who is not waiting; otherwise who differs.
        globally = (snap.state != _CODE[COLLECTIVE]) if state == COLLECTIVE else (snap.sig != dominant)
    else:
        globally = np.zeros(snap.sig.size, dtype=bool)
    apart = reporting & globally
    stacked = np.flatnonzero((snap.sig >= 0) & (snap.node >= 0))
    if stacked.size:
        order = stacked[np.argsort(snap.node[stacked], kind="stable")]
        bounds = np.flatnonzero(np.diff(snap.node[order])) + 1
        for members in np.split(order, bounds):
            if members.size < 2:
                continue  # alone on its machine: the whole round is its reference
            sigs = snap.sig[members]
            local = np.bincount(sigs)
            best = np.flatnonzero(local == local.max())
            major = int(best[0]) if best.size == 1 else (usual if usual in best.tolist() else -1)
            apart[members] = (sigs != major) if major >= 0 else False
    if dominant < 0 and not apart.any():
        return None, None
    return apart, state


def _binomial_tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def analyze_rounds(job: JobInfo, rounds: list[list[StackSample]], *, looks: int = 1) -> RoundsAnalysis:
    """Find the ranks standing outside the collective in a majority of rounds while the rest wait for them.

    `looks`: how many times this campaign has been tested as rounds were added (a sequential test): the
    false-alarm budget is split between the looks, so asking again never makes noise more likely to pass.
    """
    norm = _Normalizer()
    snaps = [_snapshot(job, r or [], norm) for r in rounds or []]
    size = max((s.sig.size for s in snaps), default=0)
    out_count = np.zeros(size, dtype=np.int64)
    seen = np.zeros(size, dtype=np.int64)
    states: list[str | None] = []
    informative = 0
    # The job's usual stack over all rounds: what a healthy rank is doing most of the time.
    every = np.concatenate([snap.sig[snap.sig >= 0] for snap in snaps]) if snaps else np.empty(0, dtype=np.int64)
    usual = int(np.bincount(every).argmax()) if every.size else -1
    for snap in snaps:
        out, state = _round_out(snap, norm, usual)
        states.append(state)
        if out is not None:  # only rounds with a clear majority say who stands apart
            informative += 1
            seen[: snap.sig.size] += snap.sig >= _NO_STACK
            out_count[: out.size] += out
    total = len(snaps)
    alpha = _ALPHA / max(1, looks)
    stragglers, apart_leading = _significant(out_count, seen, total, alpha=alpha)
    stuck, stuck_leading, stuck_why = _stuck_in_one_stack(snaps, norm, size, alpha=alpha)
    top = np.argsort(-out_count, kind="stable")[:50]
    counts = {int(r): int(out_count[r]) for r in top.tolist() if out_count[r] > 0}
    if not stragglers.size and not stuck.size:
        why = f"no rank stood apart in a majority of {total} rounds ({informative} with a clear majority stack)"
        leading = sorted(set(apart_leading) | set(stuck_leading))
        return RoundsAnalysis(total, informative, [], counts, [], "inconclusive", why, states, leading=leading)
    if not stragglers.size:  # only the second test spoke: its counts are the evidence
        return _round_suspects(job, snaps, norm, stuck, out_count, informative, states, counts, why=stuck_why)
    return _round_suspects(job, snaps, norm, stragglers, out_count, informative, states, counts)


_STUCK_SHARE = 0.8  # found in one stack in at least this share of its rounds


def _stuck_in_one_stack(
    snaps: list[_Snapshot], norm: _Normalizer, size: int, *, alpha: float
) -> tuple[np.ndarray, list[int], str]:
    """Ranks found in the same non-waiting stack in (nearly) every round, where the other ranks are seldom.

    The second test of the rounds, for a straggler whose peers are not visibly waiting: with few ranks per
    machine, a mate caught computing beside it hides it from the per-machine comparison, but across rounds
    it is always in its own work while the others pass through that stack only now and then. The rate of the
    others is the null hypothesis of a binomial test, split between the job's ranks and the looks as above.
    (stragglers, ranks worth more rounds, why)."""
    if len(snaps) < 3 or size == 0:
        return np.empty(0, dtype=np.int64), [], ""
    sigs = np.full((len(snaps), size), _UNREPORTED, dtype=np.int64)
    for i, snap in enumerate(snaps):
        sigs[i, : snap.sig.size] = snap.sig
    node, _ = _round_nodes(snaps, size)
    valid = sigs >= 0
    rounds_seen = valid.sum(axis=0)
    width = len(norm.sigs)
    # Per rank, its most frequent stack and how often it was there.
    per_rank = np.zeros((size, max(1, width)), dtype=np.int64)
    rows, cols = np.nonzero(valid)
    np.add.at(per_rank, (cols, sigs[rows, cols]), 1)
    mode = per_rank.argmax(axis=1)
    held = per_rank[np.arange(size), mode]
    overall = per_rank.sum(axis=0)
    others_rate = (overall[mode] - held) / np.maximum(1, valid.sum() - rounds_seen)
    waiting = np.array([s.cls.state == COLLECTIVE for s in norm.sigs] or [False], dtype=bool)
    candidates = np.flatnonzero((rounds_seen >= 3) & (held >= _STUCK_SHARE * rounds_seen) & ~waiting[mode])
    ranks = int((rounds_seen > 0).sum())
    keep: list[int] = []
    leading: list[int] = []
    tails: dict[tuple[int, int, float], float] = {}  # few distinct values, even over 16,384 candidates
    for r in candidates.tolist():
        args = (int(held[r]), int(rounds_seen[r]), max(float(others_rate[r]), _BASE_RATE_FLOOR))
        chance = tails.get(args)
        if chance is None:
            chance = tails[args] = _binomial_tail(*args) * ranks
        if chance >= _LEAD_CHANCE:
            continue
        mates = np.flatnonzero((node == node[r]) & (np.arange(size) != r)) if node[r] >= 0 else np.empty(0, int)
        if mates.size and bool((per_rank[mates, mode[r]] >= held[r]).all()):
            continue  # its whole machine sits there as often: the machine's timing (or the machine), not this rank
        if chance < alpha:
            keep.append(r)
        elif chance < _LEAD_CHANCE:
            leading.append(r)
    # As above: a quarter of the job in one place is a role, and so is a lead that large.
    if len(keep) > max(1, ranks // 4):
        keep = []
    if len(leading) > max(1, ranks // 4):
        leading = []
    if not keep:
        return np.empty(0, dtype=np.int64), leading, ""
    first = keep[0]
    why = (
        f"{_who(np.asarray(keep))} {_doing(int(mode[first]), norm)} in {int(held[first])}/{int(rounds_seen[first])}"
        f" rounds, where the other ranks were in {float(others_rate[first]):.0%} of theirs"
    )
    return np.asarray(keep, dtype=np.int64), leading, why


def _significant(out_count: np.ndarray, seen: np.ndarray, total: int, *, alpha: float) -> tuple[np.ndarray, list[int]]:
    """Ranks out in a majority of rounds, and more often than noise at the job's base rate explains; and the
    ranks not there yet that more rounds may settle (out in 40% of them, and unlikely by chance)."""
    if total == 0 or out_count.size == 0:
        return np.empty(0, dtype=np.int64), []
    candidates = np.flatnonzero((out_count >= 2) & (out_count >= _LEAD_SHARE * total))
    rest = np.setdiff1d(np.flatnonzero(seen > 0), candidates[out_count[candidates] * 2 > total])
    base = float(out_count[rest].sum() / max(1, seen[rest].sum())) if rest.size else 0.0
    base = max(base, _BASE_RATE_FLOOR)
    ranks = int((seen > 0).sum())
    tails = {k: _binomial_tail(k, total, base) * ranks for k in np.unique(out_count[candidates]).tolist()}
    keep = [r for r in candidates.tolist() if out_count[r] * 2 > total and tails[int(out_count[r])] < alpha]
    leading = [r for r in candidates.tolist() if r not in keep and tails[int(out_count[r])] < _LEAD_CHANCE]
    # A quarter of the job consistently apart is a different role (a pipeline stage), not a slow machine.
    if len(keep) > max(1, ranks // 4):
        return np.empty(0, dtype=np.int64), []
    return np.asarray(keep, dtype=np.int64), (leading if len(leading) <= max(1, ranks // 4) else [])


def _round_nodes(snaps: list[_Snapshot], size: int) -> tuple[np.ndarray, list[str]]:
    """Per rank, its machine from any round that knew it."""
    node = np.full(size, -1, dtype=np.int64)
    names: dict[str, int] = {}
    for snap in snaps:
        known = np.flatnonzero(snap.node >= 0)
        if known.size:
            node[known] = [names.setdefault(snap.node_names[n], len(names)) for n in snap.node[known].tolist()]
    return node, list(names)


def _who(ranks: np.ndarray) -> str:
    return f"rank {int(ranks[0])}" if ranks.size == 1 else f"ranks {_short_ranges(ranks, 6)}"


def _round_suspects(
    job: JobInfo,
    snaps: list[_Snapshot],
    norm: _Normalizer,
    stragglers: np.ndarray,
    out_count: np.ndarray,
    informative: int,
    states: list[str | None],
    counts: dict[int, int],
    *,
    why: str = "",
) -> RoundsAnalysis:
    total = len(snaps)
    node, node_names = _round_nodes(snaps, out_count.size)
    # The others visibly waiting for the stragglers in most rounds is the strong form of the evidence.
    waited = sum(1 for s in states if s == COLLECTIVE) * 2 > total
    # Apart in (nearly) every round is strong evidence on its own, even where the others' wait is not
    # visible as a collective (DDP waits inside backward).
    # (The stuck-in-one-stack test speaks only for ranks in one place in 80% of the rounds: steady too.)
    steady = bool(why) or (total >= 3 and int(out_count[stragglers].min()) >= 0.8 * total)
    base = 0.85 if waited else (0.8 if steady else 0.7)
    ids: list[int] = []
    frames: list[str] = []
    doing = ""
    for snap in reversed(snaps):  # the latest stacks first
        for rank in stragglers.tolist():
            pos = int(snap.sample_pos[rank]) if rank < snap.sample_pos.size else -1
            if pos >= 0 and snap.samples[pos].id is not None:
                ids.append(int(snap.samples[pos].id))
        first = int(stragglers[0])
        index = int(snap.sig[first]) if first < snap.sig.size else _UNREPORTED
        if not frames and index >= 0 and snap.state[first] != _CODE[COLLECTIVE]:
            frames, doing = norm.sigs[index].labels, " " + _doing(index, norm)
    if not why:
        out_of = ", ".join(f"{int(out_count[r])}/{total}" for r in stragglers[:6].tolist())
        others = "wait in a collective" if waited else "share one stack"
        why = f"{_who(stragglers)}{doing} stood apart in most rounds ({out_of}) while the others {others}"
    hosts = np.unique(node[stragglers][node[stragglers] >= 0])
    result = RoundsAnalysis(total, informative, stragglers.tolist(), counts, [], "inconclusive", why, states)
    result = replace(result, straggler_frames=frames, straggler_sample_ids=ids[:_EVIDENCE_SIGNALS])
    if hosts.size == 1:
        return replace(result, suspects=[(node_names[int(hosts[0])], base, why)], method="named")
    covering = parallel.smallest_group_covering(job, stragglers.tolist())
    if covering is None or not hosts.size:
        return replace(result, why=why + "; no small parallel group covers them")
    members = [r for r in covering[1] if r < node.size]
    group_nodes = sorted({int(n) for n in node[members].tolist() if n >= 0})
    if not parallel.nameable_group(len(group_nodes), len(node_names)):
        return replace(result, why=why + f"; their smallest covering group ({covering[0]}) is too large to name")
    hosting = set(hosts.tolist())
    why += f"; they span {hosts.size} machines, smallest covering group {covering[0]} {_short_ranges(covering[1], 6)}"
    suspects = [
        (node_names[n], 0.6 if n in hosting else 0.5, why)
        for n in sorted(group_nodes, key=lambda n: (n not in hosting, node_names[n]))
    ]
    return replace(result, suspects=suspects, method="group_fallback", why=why, covering_group=covering)


def round_findings(
    job: JobInfo, result: RoundsAnalysis, *, observed_at: datetime, category: str = "straggler"
) -> list[Finding]:
    """One finding per machine holding stragglers; nothing when no rank was consistently apart."""
    if not result.stragglers:
        return []
    key = _key(category, rank_ranges(result.stragglers), result.method, str(result.rounds))
    evidence: StackRoundsEvidence = {
        "signals": [{"type": "stack", "id": i} for i in result.straggler_sample_ids],
        "method": result.method,
        "rounds": result.rounds,
        "informative_rounds": result.informative_rounds,
        "stragglers": _short_ranges(result.stragglers),
        "out_counts": {str(r): c for r, c in list(result.out_counts.items())[:20]},
        "dominant_states": result.dominant_states,
        "straggler_frames": result.straggler_frames[:MAX_TREE_DEPTH],
        "covering_group": (
            {"dim": result.covering_group[0], "ranks": _short_ranges(result.covering_group[1])}
            if result.covering_group
            else None
        ),
    }
    if not result.suspects:
        evidence["why"] = result.why
    nobody = f"stragglers seen in stacks but no machine named: {result.why}"
    return _findings(job, category, key, result.suspects, evidence, observed_at, nobody=nobody)
