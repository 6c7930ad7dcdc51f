"""The fleet circuit breaker's trip rule, on plain data."""

from __future__ import annotations

import pytest

from service.breaker.rule import judge, most_out


@pytest.mark.parametrize(
    ("fleet", "share", "min_nodes", "max_nodes", "expected"),
    [
        (40, 0.10, 3, None, 4),  # 10% of 40
        (45, 0.10, 3, None, 4),  # rounded down: 4.5 nodes is not 5
        (10, 0.10, 3, None, 3),  # a small fleet keeps its floor
        (0, 0.10, 3, None, 3),
        (2048, 0.10, 3, 50, 50),  # a large fleet's absolute cap
        (100, 0.30, 1, None, 30),  # 0.3 * 100 in floating point is 30, not 29
        (20, 0.10, 5, 4, 4),  # the cap wins over the floor
    ],
)
def test_the_limit_is_the_share_of_the_fleet_between_the_floor_and_the_cap(
    fleet: int, share: float, min_nodes: int, max_nodes: int | None, expected: int
) -> None:
    assert most_out(fleet, share=share, min_nodes=min_nodes, max_nodes=max_nodes) == expected


def test_take_outs_pass_up_to_the_limit_then_the_first_over_it_trips_and_every_later_one_waits() -> None:
    candidates = [("evict", f"n{i}") for i in range(6)]
    verdict = judge(out={"old-1"}, candidates=candidates, most=4, tripped=False)
    assert verdict.admitted == (True, True, True, False, False, False)
    assert verdict.trips and verdict.out == 4


def test_a_batch_within_the_limit_does_not_trip() -> None:
    verdict = judge(out=set(), candidates=[("evict", "a"), ("diagnose", "b")], most=2, tripped=False)
    assert verdict.admitted == (True, True) and not verdict.trips and verdict.out == 2


def test_a_node_already_out_counts_once_and_a_gpu_reset_counts_for_nothing() -> None:
    candidates = [("evict", "a"), ("reset_gpu", "b"), ("cordon", "a"), ("evict", "c")]
    verdict = judge(out={"a"}, candidates=candidates, most=2, tripped=False)
    assert verdict.admitted == (True, True, True, True)
    assert not verdict.trips and verdict.out == 2


def test_once_tripped_every_take_out_and_gpu_reset_waits_but_job_actions_pass() -> None:
    candidates = [("evict", "a"), ("reset_gpu", "b"), ("diagnose", "c"), ("cordon", "d"), ("restart", "")]
    verdict = judge(out=set(), candidates=candidates, most=100, tripped=True)
    assert verdict.admitted == (False, False, False, False, True)
    assert not verdict.trips  # it tripped before: no second trip, no second alert


def test_after_a_trip_in_the_batch_a_gpu_reset_waits_too() -> None:
    verdict = judge(out=set(), candidates=[("evict", "a"), ("evict", "b"), ("reset_gpu", "c")], most=1, tripped=False)
    assert verdict.admitted == (True, False, False) and verdict.trips
