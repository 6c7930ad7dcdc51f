"""Page's CUSUM (ml/changepoint.py), checked by hand on small series."""

from __future__ import annotations

import math

import pytest

from ml import changepoint


def test_sums_the_excess_over_the_drift_and_never_goes_below_zero() -> None:
    assert changepoint.cusum([0.5, 3.0, 0.0, 4.0, 2.0], drift=1.0, threshold=5.0) == [0.0, 2.0, 1.0, 4.0, 5.0]


def test_a_gap_resets_the_sum() -> None:
    assert changepoint.cusum([3.0, math.nan, 3.0], drift=1.0, threshold=5.0) == [2.0, 0.0, 2.0]


def test_alarm_names_the_crossing_and_the_onset() -> None:
    # Quiet, then a shift of 3 per value: the sum leaves zero at index 3 and reaches 4 at index 4.
    hit = changepoint.alarm([0.0, 0.2, 0.9, 3.0, 3.0, 3.0], drift=1.0, threshold=4.0)
    assert hit == changepoint.Alarm(at=4, onset=3, level=6.0)


def test_a_large_shift_alarms_sooner_than_a_small_one() -> None:
    def first(step: float) -> int | None:
        for n in range(1, 30):
            if changepoint.alarm([step] * n, drift=1.0, threshold=4.0):
                return n
        return None

    assert first(5.0) == 1
    assert first(3.0) == 2
    assert first(1.5) == 8
    assert first(1.0) is None  # at the drift: never


def test_noise_under_the_drift_and_a_change_that_went_back_make_no_alarm() -> None:
    assert changepoint.alarm([0.9, 0.5, 1.0, 0.0] * 10, drift=1.0, threshold=4.0) is None
    assert changepoint.alarm([5.0, 5.0, -20.0, 0.0], drift=0.0, threshold=4.0) is None


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        changepoint.cusum([1.0], drift=-1.0, threshold=1.0)
    with pytest.raises(ValueError):
        changepoint.alarm([1.0], drift=0.0, threshold=0.0)
