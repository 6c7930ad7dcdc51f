"""Parallel groups from a job's tp/pp/dp and rank order."""

from __future__ import annotations

import numpy as np
import pytest

from ml.findings import JobInfo
from ml.parallel import (
    coordinates,
    coordinates_array,
    group,
    groups,
    layout,
    pipeline_neighbours,
    pipeline_neighbours_array,
    smallest_group_covering,
)

# Megatron's initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4 (so dp=2), order tp-dp-pp.
MEGATRON = JobInfo("m", world_size=16, tp=2, pp=4)


def test_megatron_documented_example() -> None:
    assert [group(MEGATRON, r, "tp") for r in (0, 2, 14)] == [[0, 1], [2, 3], [14, 15]]
    assert [group(MEGATRON, r, "pp") for r in (0, 1, 2, 3)] == [
        [0, 4, 8, 12],
        [1, 5, 9, 13],
        [2, 6, 10, 14],
        [3, 7, 11, 15],
    ]
    assert [group(MEGATRON, r, "dp") for r in (0, 1, 4, 13)] == [[0, 2], [1, 3], [4, 6], [13, 15]]
    assert coordinates(MEGATRON, 13) == {"tp": 1, "pp": 3, "dp": 0}
    assert layout(MEGATRON).sizes == {"tp": 2, "pp": 4, "dp": 2}


@pytest.mark.parametrize(
    ("order", "rank", "coords", "tp_group", "dp_group", "pp_group"),
    [
        ("tp-dp-pp", 5, {"tp": 1, "dp": 0, "pp": 1}, [4, 5], [5, 7], [1, 5]),
        ("tp-pp-dp", 5, {"tp": 1, "pp": 0, "dp": 1}, [4, 5], [1, 5], [5, 7]),
        ("dp-tp-pp", 5, {"dp": 1, "tp": 0, "pp": 1}, [5, 7], [4, 5], [1, 5]),
        ("pp-dp-tp", 6, {"pp": 0, "dp": 1, "tp": 1}, [2, 6], [4, 6], [6, 7]),
        ("TP-CP-EP-DP-PP", 5, {"tp": 1, "dp": 0, "pp": 1}, [4, 5], [5, 7], [1, 5]),  # cp, ep are size 1
    ],
)
def test_orders(order: str, rank: int, coords: dict, tp_group: list, dp_group: list, pp_group: list) -> None:
    job = JobInfo("j", world_size=8, tp=2, pp=2, order=order)
    assert coordinates(job, rank) == coords
    assert groups(job, rank) == {"tp": tp_group, "pp": pp_group, "dp": dp_group}


def test_dp_and_world_size_defaults() -> None:
    from_world = JobInfo("j", world_size=64, tp=8, pp=2)
    assert layout(from_world).sizes["dp"] == 4
    from_map = JobInfo("j", tp=4, pp=2, rank_nodes={r: f"n{r // 8}" for r in range(32)})
    assert layout(from_map).world_size == 32 and layout(from_map).sizes["dp"] == 4


def test_every_rank_is_in_exactly_one_group_per_dimension() -> None:
    job = JobInfo("j", world_size=48, tp=4, pp=3, order="tp-pp-dp")
    for dim in ("tp", "pp", "dp"):
        seen = sorted(r for start in range(48) for r in group(job, start, dim) if min(group(job, start, dim)) == start)
        assert seen == list(range(48)), dim


def test_vectorized_matches_scalar_at_scale() -> None:
    job = JobInfo("j", world_size=16384, tp=8, pp=8)
    ranks = np.random.default_rng(0).integers(0, 16384, 200)
    arrays = coordinates_array(job, ranks)
    prev, nxt = pipeline_neighbours_array(job, ranks)
    for i, rank in enumerate(ranks.tolist()):
        assert {d: int(arrays[d][i]) for d in ("tp", "pp", "dp")} == coordinates(job, rank)
        p, n = pipeline_neighbours(job, rank)
        assert (int(prev[i]), int(nxt[i])) == (p if p is not None else -1, n if n is not None else -1)


def test_pipeline_neighbours() -> None:
    assert pipeline_neighbours(MEGATRON, 4) == (0, 8)
    assert pipeline_neighbours(MEGATRON, 1) == (None, 5)
    assert pipeline_neighbours(MEGATRON, 13) == (9, None)
    single_stage = JobInfo("j", world_size=8, tp=8)
    assert pipeline_neighbours(single_stage, 3) == (None, None)


def test_smallest_group_covering() -> None:
    assert smallest_group_covering(MEGATRON, [0, 1]) == ("tp", [0, 1])
    assert smallest_group_covering(MEGATRON, [4, 12]) == ("pp", [0, 4, 8, 12])
    assert smallest_group_covering(MEGATRON, [9, 11]) == ("dp", [9, 11])
    # Ranks that differ in two coordinates: the smaller of the two-dimension groups holding both.
    assert smallest_group_covering(MEGATRON, [0, 3]) == ("tp-dp", [0, 1, 2, 3])
    assert smallest_group_covering(MEGATRON, [0, 5]) == ("tp-pp", [0, 1, 4, 5, 8, 9, 12, 13])
    # Differ in all three: only the whole job holds them, which is no group.
    assert smallest_group_covering(MEGATRON, [0, 15]) is None
    assert smallest_group_covering(MEGATRON, []) is None
