"""A job's parallel groups (tensor, pipeline, data parallel) computed from its size and rank order.

Megatron-style order strings name the dimensions from the fastest- to the slowest-varying along the global
rank: with order "tp-dp-pp", tp=2, dp=2, pp=2, ranks 0 and 1 share a TP group, ranks 0 and 2 a DP group and
ranks 0 and 4 a PP group. Everything here is arithmetic on that layout, vectorized where a 16,384-rank job
needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from ml.findings import JobInfo

DIMS = ("tp", "pp", "dp")
_DEFAULT_ORDER = ("tp", "dp", "pp")


@dataclass(frozen=True, slots=True)
class Layout:
    """Sizes and strides of each parallel dimension of one job."""

    world_size: int
    sizes: dict[str, int]
    strides: dict[str, int]
    order: tuple[str, ...]  # fastest-varying first


def _parse_order(order: str) -> tuple[str, ...]:
    # Dimensions this contract does not size (cp, ep) have size 1 and do not change any stride.
    seen = [d for d in (order or "").lower().replace("_", "-").split("-") if d in DIMS]
    ordered = list(dict.fromkeys(seen))
    return (*ordered, *(d for d in _DEFAULT_ORDER if d not in ordered))


def layout(job: JobInfo | Layout) -> Layout:
    """The job's layout: dp defaults to world_size / (tp * pp); world_size to the ranks known."""
    if isinstance(job, Layout):
        return job
    tp, pp = max(1, int(job.tp or 1)), max(1, int(job.pp or 1))
    world = job.world_size
    if not world:
        known = max(job.rank_nodes, default=-1) + 1 if job.rank_nodes else 0
        world = max(known, tp * pp * (job.dp or 1))
    dp = int(job.dp) if job.dp else max(1, world // (tp * pp))
    sizes = {"tp": tp, "pp": pp, "dp": max(1, dp)}
    order = _parse_order(job.order)
    strides: dict[str, int] = {}
    stride = 1
    for dim in order:
        strides[dim] = stride
        stride *= sizes[dim]
    return Layout(world_size=int(world), sizes=sizes, strides=strides, order=order)


def coordinates(job: JobInfo | Layout, rank: int) -> dict[str, int]:
    """The rank's index along tp, pp and dp."""
    lay = layout(job)
    coords = {d: (rank // lay.strides[d]) % lay.sizes[d] for d in DIMS}
    # Ranks beyond tp*pp*dp (an inconsistent job description) keep counting along the slowest dimension.
    slowest = lay.order[-1]
    coords[slowest] = rank // lay.strides[slowest]
    return coords


def coordinates_array(job: JobInfo | Layout, ranks: Iterable[int] | np.ndarray) -> dict[str, np.ndarray]:
    """Vectorized `coordinates`: one int64 array per dimension."""
    lay = layout(job)
    arr = np.asarray(list(ranks) if not isinstance(ranks, np.ndarray) else ranks, dtype=np.int64)
    out = {d: (arr // lay.strides[d]) % lay.sizes[d] for d in DIMS}
    slowest = lay.order[-1]
    out[slowest] = arr // lay.strides[slowest]
    return out


def _group_ranks(lay: Layout, rank: int, dims: tuple[str, ...]) -> list[int]:
    coords = coordinates(lay, rank)
    base = rank - sum(coords[d] * lay.strides[d] for d in dims)
    members = np.array([base], dtype=np.int64)
    for dim in dims:
        steps = np.arange(lay.sizes[dim], dtype=np.int64) * lay.strides[dim]
        members = (members[:, None] + steps[None, :]).ravel()
    return sorted(int(r) for r in members)


def group(job: JobInfo | Layout, rank: int, dim: str) -> list[int]:
    """The ranks of `rank`'s group along one dimension ("tp", "pp", "dp") or several ("tp-pp")."""
    dims = tuple(d for d in DIMS if d in dim.split("-"))
    return _group_ranks(layout(job), rank, dims) if dims else [rank]


def groups(job: JobInfo | Layout, rank: int) -> dict[str, list[int]]:
    """The rank's TP, PP and DP groups."""
    lay = layout(job)
    return {d: _group_ranks(lay, rank, (d,)) for d in DIMS}


def group_id_array(job: JobInfo | Layout, ranks: np.ndarray, dim: str) -> np.ndarray:
    """An id per rank, equal for ranks in the same group along `dim` (its rank with that coordinate zeroed)."""
    lay = layout(job)
    coords = coordinates_array(lay, ranks)
    dims = [d for d in DIMS if d in dim.split("-")]
    return np.asarray(ranks, dtype=np.int64) - sum(coords[d] * lay.strides[d] for d in dims)


def smallest_group_covering(job: JobInfo | Layout, ranks: Iterable[int]) -> tuple[str, list[int]] | None:
    """The smallest TP, PP or DP group (or a pair of them, e.g. "tp-pp") holding every rank, else None.

    The whole job is not a group: None means the ranks share no parallel group smaller than the job.
    """
    lay = layout(job)
    wanted = np.unique(np.asarray(list(ranks), dtype=np.int64))
    if wanted.size == 0:
        return None
    coords = coordinates_array(lay, wanted)
    same = {d: bool(np.all(coords[d] == coords[d][0])) for d in DIMS}
    candidates: list[tuple[int, int, tuple[str, ...]]] = []
    for width in (1, 2):
        for dims in combinations(DIMS, width):
            # Covering: the ranks agree on every coordinate outside the group's dimensions.
            if all(same[d] for d in DIMS if d not in dims):
                size = int(np.prod([lay.sizes[d] for d in dims]))
                candidates.append((size, width, dims))
    if not candidates:
        return None
    _, _, dims = min(candidates, key=lambda c: (c[0], c[1], [DIMS.index(d) for d in c[2]]))
    return "-".join(dims), _group_ranks(lay, int(wanted[0]), dims)


def pipeline_neighbours(job: JobInfo | Layout, rank: int) -> tuple[int | None, int | None]:
    """(previous stage's rank, next stage's rank) in the rank's PP group; None at the ends."""
    lay = layout(job)
    stage = coordinates(lay, rank)["pp"]
    stride = lay.strides["pp"]
    prev = rank - stride if stage > 0 else None
    nxt = rank + stride if stage < lay.sizes["pp"] - 1 else None
    return prev, nxt


def pipeline_neighbours_array(job: JobInfo | Layout, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized `pipeline_neighbours`, with -1 where there is no neighbour."""
    lay = layout(job)
    arr = np.asarray(ranks, dtype=np.int64)
    stage = coordinates_array(lay, arr)["pp"]
    stride = lay.strides["pp"]
    prev = np.where(stage > 0, arr - stride, -1)
    nxt = np.where(stage < lay.sizes["pp"] - 1, arr + stride, -1)
    return prev, nxt


# A group fallback names at most this many machines, and never more than half of the job's: naming most of a
# job (all 8 nodes of an 8-node job) is an accusation spray, not a localization. Such evidence stays job-level.
MAX_GROUP_NODES = 8


def nameable_group(group_nodes: int, job_nodes: int) -> bool:
    """Whether a parallel group spanning `group_nodes` machines is small enough to name as the suspects."""
    return 0 < group_nodes <= MAX_GROUP_NODES and 2 * group_nodes <= job_nodes
