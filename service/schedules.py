"""A beat schedule on the wall clock's marks: every interval, a fixed phase past each multiple of it.

Celery's interval schedule runs every N seconds from whenever beat started. Metric windows close at fixed marks
(their end plus the grace), so a pass at an arbitrary phase waits up to a whole interval for the window that just
closed; a pass just after each mark judges it at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import schedstate, schedule

from service.config import Settings

PASS_PHASE_S = 0.2  # after the mark a window closes on: the clocks of beat and the database differ a little


class aligned(schedule):  # lower case, as Celery's own schedules (schedule, crontab, solar)
    """Due at `phase_s` past every multiple of `run_every` on the UTC clock (the epoch's marks)."""

    def __init__(
        self, run_every: timedelta, phase_s: float = 0.0, nowfun: Callable[[], datetime] | None = None, app: Any = None
    ) -> None:
        super().__init__(run_every, relative=False, nowfun=nowfun, app=app)
        self.phase_s = float(phase_s)

    def _period(self) -> float:
        return self.run_every.total_seconds()

    def _next_mark(self, after: float) -> float:
        """The first mark strictly after `after` (epoch seconds)."""
        return (math.floor((after - self.phase_s) / self._period()) + 1) * self._period() + self.phase_s

    def crossed(self, before: datetime, after: datetime) -> bool:
        """Whether a mark falls in (before, after]: for a harness that steps its own clock (lab/evaluation/soak.py)."""
        return self._next_mark(before.timestamp()) <= after.timestamp()

    def _now_s(self) -> float:
        return self.maybe_make_aware(self.now()).timestamp()

    def _remaining_s(self, last_run_at: datetime, now: float) -> float:
        """Seconds from `now` to the first mark after the last run (negative: that mark has passed)."""
        return self._next_mark(self.maybe_make_aware(last_run_at).timestamp()) - now

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=self._remaining_s(last_run_at, self._now_s()))

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = self._now_s()  # one reading of the clock for both answers
        remaining = self._remaining_s(last_run_at, now)
        if remaining > 0:
            return schedstate(is_due=False, next=remaining)
        return schedstate(is_due=True, next=self._next_mark(now) - now)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return self.__class__, (self.run_every, self.phase_s, self.nowfun)

    def __repr__(self) -> str:
        return f"<aligned: every {self._period():g} s, {self.phase_s:g} s past the mark>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, aligned) and (self.run_every, self.phase_s) == (other.run_every, other.phase_s)

    __hash__ = None  # type: ignore[assignment]  # mutable, as Celery's own


def diagnosis_passes(settings: Settings) -> aligned:
    """The periodic diagnosis passes: every `diagnosis_interval_s`, just after the GPU windows close (their end plus
    `window_grace_s`), so that a pass judges the window that closed at once, not up to an interval later."""
    interval = settings.diagnosis_interval_s
    return aligned(timedelta(seconds=interval), phase_s=(settings.window_grace_s + PASS_PHASE_S) % interval)
