"""The diagnosis pass's beat schedule keeps to the wall clock's marks (service/schedules.py): a pass right after the
GPU windows close, whenever beat started."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from service.config import get_settings
from service.schedules import aligned
from service.worker import celery_app

T = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T

    def __call__(self) -> datetime:
        return self.now


def test_due_at_each_mark_whenever_it_last_ran() -> None:
    clock = Clock()
    every = aligned(timedelta(seconds=5), phase_s=1.2, nowfun=clock)
    clock.now = T + timedelta(seconds=3.5)
    due, wait = every.is_due(T)  # the mark at 01.2 passed since the last run
    assert due and abs(wait - 2.7) < 1e-6  # then the one at 06.2
    due, wait = every.is_due(T + timedelta(seconds=1.3))  # it ran at 01.3
    assert not due and abs(wait - 2.7) < 1e-6
    clock.now = T + timedelta(seconds=6.25)
    due, wait = every.is_due(T + timedelta(seconds=1.3))
    assert due and abs(wait - 4.95) < 1e-6
    # A beat started at an odd moment keeps to the marks, not to its start: its first run is at the next mark.
    clock.now = T + timedelta(seconds=17.9)
    due, wait = every.is_due(T + timedelta(seconds=17.8))
    assert not due and abs(wait - 3.3) < 1e-6


def test_it_survives_beats_schedule_file() -> None:
    every = aligned(timedelta(seconds=5), phase_s=1.2)
    again = pickle.loads(pickle.dumps(every))
    assert again == every and again.phase_s == 1.2 and again != aligned(timedelta(seconds=5), phase_s=2.0)


def test_the_diagnosis_pass_runs_just_after_the_gpu_windows_close() -> None:
    settings = get_settings()
    every = celery_app.conf.beat_schedule["detect-active-jobs"]["schedule"]
    assert isinstance(every, aligned)
    assert every.run_every == timedelta(seconds=settings.diagnosis_interval_s)
    # A window [t, t + 10 s) closes window_grace_s after its end; the pass comes a fraction of a second later.
    after_close = (every.phase_s - settings.window_grace_s) % settings.diagnosis_interval_s
    assert 0 < after_close < 1


def test_a_harness_stepping_its_own_clock_meets_the_same_marks() -> None:
    every = aligned(timedelta(seconds=5), phase_s=1.2)
    steps = [T + timedelta(seconds=s) for s in range(21)]
    crossed = [round((b - T).total_seconds()) for a, b in pairwise(steps) if every.crossed(a, b)]
    assert crossed == [2, 7, 12, 17]  # the first whole second after each mark at 01.2, 06.2, ...
