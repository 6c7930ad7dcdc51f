"""ETTR (effective training time ratio) of one job from its step progress, restarts, incidents and checkpoint saves.

Input: the job's step records as one logging stream, (time, step) in time order (a job logs its steps on one
rank, or every rank logs the same steps: the caller picks one stream); the time the job began and the end of
the measurement (now, or its last report); its incidents; its checkpoint saves.

Definitions (what the numbers mean, precisely):

- **Step interval**: the time between two consecutive step records, (t0, s0) -> (t1, s1); it trained
  s1 - s0 steps when s1 > s0. A record repeating the step of the one before it is dropped (the first counts).
- **Median step time**: the median over forward intervals (s1 > s0) of (t1 - t0) / (s1 - s0).
- **Productive**: an interval counts when it advances past the highest step reached before it (the high-water
  mark): of its s1 - s0 steps, only the s1 - max(s0, high) new ones count, each for (t1 - t0) / (s1 - s0)
  seconds. A **pause**, an interval slower than `pause_factor` x the median step time per step (a checkpoint
  save, an evaluation, a stall), counts only the median step time for each new step: the rest is lost.
  Steps at or below the high-water mark are **redone** (a restart went back to a checkpoint) and do not
  count; nor does time before the first step record (start-up, loading) or after the last one.
- **Restart**: a step record lower than the one before it (the job resumed from a checkpoint).
- **ETTR** over a window = productive seconds in it / wall seconds of it (productive time of an interval is
  spread evenly over it). Cumulative: from the job's start to the end; sliding: over the last `window`.
- **Time lost per incident**: from the last productive step record at or before the incident opened, to the
  first productive step record after it (the first record past the high-water mark the job had when the
  incident opened). It splits into **down** (to the first step record after the incident opened: the outage,
  the restart, the checkpoint load) and **redone** (from there to the first productive record: the time the
  job took to get back to the step it had reached). An incident the job is still down from loses until the
  end (`ongoing`). Incidents may overlap, so their losses need not add up to wall - productive time.
- **Stall**: a maximal stretch of lost time (wall - productive > 0) between step records: from the last record
  of a fully productive interval to the first record after which the job trains at its pace again; the time
  before the first record is the **start-up**. Each stall is **charged once**, to the incident that caused it:
  the first incident that opened during it (a fault stops the job after its last productive step, and is
  detected after that), else the incident open when it began (the newest of them); other incidents overlapping
  it are listed, not charged. The lost time sums exactly: charged to incidents + start-up and stalls no
  incident explains + the time since the last record while the next is not yet due (shorter than a pause) =
  wall - productive = wall x (1 - ETTR).

No step record at all means the job's progress is unknown: the ratios are None, not 0.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

DEFAULT_PAUSE_FACTOR = 5.0
DEFAULT_WINDOW = timedelta(hours=1)
DEFAULT_POINTS = 120  # points of the time series drawn on the job page


@dataclass(frozen=True, slots=True)
class StepRecord:
    ts: datetime
    step: int


@dataclass(frozen=True, slots=True)
class IncidentSpan:
    id: int
    opened_at: datetime
    resolved_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CheckpointSave:
    ts: datetime
    step: int


@dataclass(frozen=True, slots=True)
class Restart:
    ts: datetime  # the first step record after the restart
    from_step: int  # the high-water mark before it
    to_step: int  # the first step it logged
    checkpoint_step: int | None  # the last save at or before from_step, before the restart


@dataclass(frozen=True, slots=True)
class IncidentLoss:
    id: int
    opened_at: datetime
    last_productive_at: datetime | None  # None: no productive step before it (lost from the job's start)
    resumed_at: datetime | None  # the first step record after it opened
    productive_again_at: datetime | None  # None: still not past the step it had reached (ongoing)
    step_reached: int | None  # the high-water mark when it opened
    resumed_step: int | None
    checkpoint_step: int | None  # the last save before it opened
    steps_redone: int
    lost_s: float
    down_s: float
    redone_s: float

    @property
    def ongoing(self) -> bool:
        return self.productive_again_at is None


@dataclass(frozen=True, slots=True)
class Stall:
    """Lost time charged once (see the module docstring)."""

    start: datetime  # the last productive step record (the job's start for the start-up)
    end: datetime  # the first record the job trains at its pace from again (the end, while ongoing)
    lost_s: float  # wall - productive time within it
    incident_id: int | None  # the incident charged; None when no incident explains it
    also: tuple[int, ...]  # the other incidents open during it: not charged
    startup: bool  # before the first step record
    step_reached: int | None  # the high-water mark when it began
    resumed_step: int | None  # the first step logged after it began
    checkpoint_step: int | None  # the last save at or below step_reached before the job resumed
    restarts: int  # step records lower than the one before them, within it
    steps_redone: int  # steps trained again (at or below the high-water mark) within it
    down_s: float  # to the first step record after it began
    redone_s: float  # the rest of its lost time: getting back to step_reached
    ongoing: bool


@dataclass(frozen=True, slots=True)
class LostTime:
    """wall - productive over the whole span, split by what it went to; the parts add up to `total_s`."""

    total_s: float
    charged_s: float  # stalls charged to an incident (by_incident sums to it)
    startup_s: float  # before the first step record, no incident open
    unexplained_s: float  # stalls and pauses (checkpoint saves, evaluations) no incident explains
    pending_s: float  # since the last step record, shorter than a pause: the next one is not due yet
    by_incident: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Point:
    ts: datetime
    cumulative: float | None
    window: float | None


@dataclass(frozen=True, slots=True)
class Span:
    """A window's numbers: productive and wall seconds and their ratio (None without steps or time)."""

    start: datetime
    end: datetime
    productive_s: float
    wall_s: float
    ratio: float | None


@dataclass
class EttrReport:
    cumulative: Span
    window: Span
    window_s: float
    median_step_s: float | None
    pause_factor: float
    highest_step: int | None
    steps_seen: int
    restarts: list[Restart] = field(default_factory=list)
    incidents: list[IncidentLoss] = field(default_factory=list)
    checkpoints: int = 0
    last_checkpoint_step: int | None = None
    series: list[Point] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    lost: LostTime | None = None


@dataclass(frozen=True, slots=True)
class _Interval:
    start: float  # seconds since the epoch
    end: float
    productive: float  # seconds, spread evenly over [start, end]
    new_high: bool  # the record at its end advanced the high-water mark


class _Productive:
    """Productive seconds up to any time, by prefix sums over the intervals (sorted, disjoint)."""

    def __init__(self, intervals: Sequence[_Interval]) -> None:
        self.starts = [i.start for i in intervals]
        self.intervals = intervals
        self.before: list[float] = [0.0]
        for i in intervals:
            self.before.append(self.before[-1] + i.productive)

    def upto(self, t: float) -> float:
        k = bisect.bisect_right(self.starts, t)
        if k == 0:
            return 0.0
        last = self.intervals[k - 1]
        total = self.before[k - 1]
        if t >= last.end or last.end <= last.start:
            return total + last.productive
        return total + last.productive * (t - last.start) / (last.end - last.start)

    def between(self, a: float, b: float) -> float:
        return max(0.0, self.upto(b) - self.upto(a))


def median_step_s(steps: Sequence[StepRecord]) -> float | None:
    """The median over forward intervals of seconds per step; None with fewer than two advancing records."""
    paces = [(b.ts - a.ts).total_seconds() / (b.step - a.step) for a, b in itertools.pairwise(steps) if b.step > a.step]
    return statistics.median(paces) if paces else None


def _intervals(steps: Sequence[StepRecord], median: float | None, pause_factor: float) -> list[_Interval]:
    out: list[_Interval] = []
    if not steps:
        return out
    high = steps[0].step
    for a, b in itertools.pairwise(steps):
        dt = (b.ts - a.ts).total_seconds()
        productive = 0.0
        new_high = b.step > high
        if new_high and b.step > a.step and dt > 0:
            count = b.step - a.step
            new = b.step - max(a.step, high)
            pace = dt / count
            # A pause (a save, an evaluation, a stall): only the steps' usual time counts.
            productive = median * new if median is not None and pace > pause_factor * median else pace * new
        if new_high:
            high = b.step
        out.append(_Interval(a.ts.timestamp(), b.ts.timestamp(), productive, new_high))
    return out


def _span(productive: _Productive, start: datetime, end: datetime, has_steps: bool) -> Span:
    wall = max(0.0, (end - start).total_seconds())
    done = productive.between(start.timestamp(), end.timestamp()) if wall else 0.0
    ratio = min(1.0, done / wall) if wall and has_steps else None
    return Span(start=start, end=end, productive_s=done, wall_s=wall, ratio=ratio)


def _last_save(checkpoints: Sequence[CheckpointSave], *, before: datetime, at_most: int | None) -> int | None:
    saved = [c.step for c in checkpoints if c.ts <= before and (at_most is None or c.step <= at_most)]
    return max(saved) if saved else None


def _restarts(steps: Sequence[StepRecord], checkpoints: Sequence[CheckpointSave]) -> list[Restart]:
    out: list[Restart] = []
    high: int | None = None
    for a, b in itertools.pairwise(steps):
        high = a.step if high is None else max(high, a.step)
        if b.step < a.step:
            out.append(Restart(b.ts, high, b.step, _last_save(checkpoints, before=b.ts, at_most=high)))
    return out


def _incident_loss(
    incident: IncidentSpan,
    steps: Sequence[StepRecord],
    times: Sequence[datetime],
    intervals: Sequence[_Interval],
    checkpoints: Sequence[CheckpointSave],
    *,
    start: datetime,
    end: datetime,
    highs: Sequence[int],
) -> IncidentLoss:
    opened = incident.opened_at
    # Index of the last record at or before the opening; the high-water mark then (highs: the prefix maxima).
    k = bisect.bisect_right(times, opened) - 1
    reached = highs[k] if k >= 0 else None
    last_productive: datetime | None = None
    for j in range(k, 0, -1):  # intervals[j - 1] ends at steps[j]
        if intervals[j - 1].new_high:
            last_productive = steps[j].ts
            break
    if last_productive is None and k >= 0:
        last_productive = steps[0].ts  # the first record: the job was running
    resumed = steps[k + 1] if k + 1 < len(steps) else None
    again: StepRecord | None = None
    for s in steps[k + 1 :]:
        if reached is None or s.step > reached:
            again = s
            break
    checkpoint = _last_save(checkpoints, before=opened, at_most=reached)
    redone_steps = 0
    if reached is not None and resumed is not None and resumed.step <= reached:
        base = checkpoint if checkpoint is not None and checkpoint < resumed.step else resumed.step - 1
        redone_steps = reached - base
    begin = last_productive or start
    until = again.ts if again else end
    down_until = resumed.ts if resumed else end
    return IncidentLoss(
        id=incident.id,
        opened_at=opened,
        last_productive_at=last_productive,
        resumed_at=resumed.ts if resumed else None,
        productive_again_at=again.ts if again else None,
        step_reached=reached,
        resumed_step=resumed.step if resumed else None,
        checkpoint_step=checkpoint,
        steps_redone=redone_steps,
        lost_s=max(0.0, (until - begin).total_seconds()),
        down_s=max(0.0, (min(down_until, until) - begin).total_seconds()),
        redone_s=max(0.0, (until - down_until).total_seconds()) if resumed else 0.0,
    )


def cause(
    incidents: Sequence[IncidentSpan],
    *,
    start: datetime,
    end: datetime,
    ongoing: bool = False,
    pause: bool = False,
) -> tuple[int | None, tuple[int, ...]]:
    """The incident a stretch of lost time [start, end] is charged to, and the others that overlap it.

    The first to open within it: the fault that stopped the job struck after its last productive step and was
    detected after that, so an incident already open while the job still trained did not stop it. When none
    opened within it, the one open when it began (the newest): a fault whose own stall incident was merged into
    it. Not for a `pause` (one slow interval that still advanced: a checkpoint save, an evaluation), which an
    incident opened before it did not cause. An ongoing stretch takes incidents opened at its end.
    """

    def overlaps(i: IncidentSpan) -> bool:
        opened_in_time = i.opened_at <= end if ongoing else i.opened_at < end
        return opened_in_time and (i.resolved_at is None or i.resolved_at > start)

    overlapping = sorted((i for i in incidents if overlaps(i)), key=lambda i: (i.opened_at, i.id))
    opened_within = [i for i in overlapping if i.opened_at >= start]
    open_before = [] if pause else [i for i in overlapping if i.opened_at < start]
    chosen = opened_within[0] if opened_within else open_before[-1] if open_before else None
    if chosen is None:
        return None, tuple(i.id for i in overlapping)
    return chosen.id, tuple(i.id for i in overlapping if i.id != chosen.id)


_EPS_S = 1e-6  # float noise of pace x steps: an interval losing less than this lost nothing


def _stall(
    steps: Sequence[StepRecord],
    first: int,
    last: int,
    lost: float,
    *,
    end: datetime,
    tail: bool,
    checkpoints: Sequence[CheckpointSave],
    incidents: Sequence[IncidentSpan],
    highs: Sequence[int],
) -> Stall:
    """A stall over the intervals steps[first] -> steps[last] (and on to `end` when `tail`); `highs[k]`: the
    high-water mark at steps[k] (a prefix maximum, so a job with many stalls is not rescanned for each)."""
    reached = highs[first]
    within = steps[first : last + 1]
    resumed = within[1] if len(within) > 1 else None
    restarts = [b for a, b in itertools.pairwise(within) if b.step < a.step]
    checkpoint = _last_save(checkpoints, before=restarts[0].ts, at_most=reached) if restarts else None
    high, redone = reached, 0
    for a, b in itertools.pairwise(within):
        if b.step < a.step:  # a restart: from the checkpoint it loaded (else the step before its first) to b
            base = _last_save(checkpoints, before=b.ts, at_most=b.step)
            redone += max(0, min(b.step, high) - (base if base is not None else b.step - 1))
        else:
            redone += max(0, min(b.step, high) - a.step)
        high = max(high, b.step)
    start = steps[first].ts
    stop = end if tail else steps[last].ts
    ongoing = tail and max(s.step for s in within) <= reached
    pause = not tail and len(within) == 2 and within[1].step > reached
    charged, also = cause(incidents, start=start, end=stop, ongoing=ongoing, pause=pause)
    down = max(0.0, ((resumed.ts if resumed else stop) - start).total_seconds())
    return Stall(
        start=start,
        end=stop,
        lost_s=lost,
        incident_id=charged,
        also=also,
        startup=False,
        step_reached=reached,
        resumed_step=resumed.step if resumed else None,
        checkpoint_step=checkpoint,
        restarts=len(restarts),
        steps_redone=redone,
        down_s=min(down, lost),
        redone_s=max(0.0, lost - down),
        ongoing=ongoing,
    )


def _stalls(
    steps: Sequence[StepRecord],
    productive: _Productive,
    *,
    start: datetime,
    end: datetime,
    median: float | None,
    pause_factor: float,
    incidents: Sequence[IncidentSpan],
    checkpoints: Sequence[CheckpointSave],
    highs: Sequence[int],
) -> tuple[list[Stall], LostTime]:
    """The job's lost time cut into stalls, each charged once, and the split of the whole (module docstring)."""
    out: list[Stall] = []
    wall = max(0.0, (end - start).total_seconds())
    if not steps:
        charged, also = cause(incidents, start=start, end=end, ongoing=True)
        out.append(Stall(start, end, wall, charged, also, True, None, None, None, 0, 0, wall, 0.0, True))
    else:
        startup = max(0.0, (steps[0].ts - start).total_seconds())
        if startup > _EPS_S:
            charged, also = cause(incidents, start=start, end=steps[0].ts)
            out.append(
                Stall(start, steps[0].ts, startup, charged, also, True, None, None, None, 0, 0, startup, 0.0, False)
            )
        run: tuple[int, float] | None = None  # (the record the open stall began at, its lost seconds so far)
        for k, interval in enumerate(productive.intervals):
            lost = max(0.0, (interval.end - interval.start) - interval.productive)
            if lost > _EPS_S:
                run = (run[0], run[1] + lost) if run else (k, lost)
            elif run:
                out.append(
                    _stall(
                        steps,
                        run[0],
                        k,
                        run[1],
                        end=end,
                        tail=False,
                        checkpoints=checkpoints,
                        incidents=incidents,
                        highs=highs,
                    )
                )
                run = None
        tail = max(0.0, (end - steps[-1].ts).total_seconds())
        # The next step line is not due yet: the time since the last one is lost only once it is overdue.
        due = run is None and median is not None and tail <= pause_factor * median
        if run or (tail > _EPS_S and not due):
            first, lost = run if run else (len(steps) - 1, 0.0)
            out.append(
                _stall(
                    steps,
                    first,
                    len(steps) - 1,
                    lost + tail,
                    end=end,
                    tail=True,
                    checkpoints=checkpoints,
                    incidents=incidents,
                    highs=highs,
                )
            )
    by_incident: dict[int, float] = {}
    for s in out:
        if s.incident_id is not None:
            by_incident[s.incident_id] = by_incident.get(s.incident_id, 0.0) + s.lost_s
    free = [s for s in out if s.incident_id is None]
    startup_s = sum(s.lost_s for s in free if s.startup)
    unexplained = sum(s.lost_s for s in free if not s.startup)
    charged_s = sum(by_incident.values())
    total = wall - productive.between(start.timestamp(), end.timestamp()) if wall else 0.0
    pending = max(0.0, total - charged_s - startup_s - unexplained)
    return out, LostTime(total, charged_s, startup_s, unexplained, pending, by_incident)


def _first_of_repeats(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """A step logged again right after itself (another rank, a repeated line) is the same step: its first record."""
    return [s for i, s in enumerate(steps) if i == 0 or s.step != steps[i - 1].step]


def compute(
    steps: Sequence[StepRecord],
    *,
    start: datetime,
    end: datetime,
    incidents: Sequence[IncidentSpan] = (),
    checkpoints: Sequence[CheckpointSave] = (),
    window: timedelta = DEFAULT_WINDOW,
    pause_factor: float = DEFAULT_PAUSE_FACTOR,
    points: int = DEFAULT_POINTS,
) -> EttrReport:
    """The job's ETTR since `start` and over the last `window` to `end`, its time series, restarts, and the time
    each incident lost (see the module docstring)."""
    ordered = _first_of_repeats(sorted((s for s in steps if start <= s.ts <= end), key=lambda s: s.ts))
    saves = sorted(checkpoints, key=lambda c: c.ts)
    median = median_step_s(ordered)
    productive = _Productive(_intervals(ordered, median, pause_factor))
    has_steps = bool(ordered)
    window_start = max(start, end - window)
    series: list[Point] = []
    if end > start and points > 1:
        span = (end - start) / (points - 1)
        for i in range(points):
            t = start + span * i
            if t == start:
                continue
            cumulative = _span(productive, start, t, has_steps).ratio
            series.append(Point(t, cumulative, _span(productive, max(start, t - window), t, has_steps).ratio))
    intervals = productive.intervals
    times = [s.ts for s in ordered]
    highs = list(itertools.accumulate((s.step for s in ordered), max))
    stalls, lost = _stalls(
        ordered,
        productive,
        start=start,
        end=end,
        median=median,
        pause_factor=pause_factor,
        incidents=incidents,
        checkpoints=saves,
        highs=highs,
    )
    return EttrReport(
        cumulative=_span(productive, start, end, has_steps),
        window=_span(productive, window_start, end, has_steps),
        window_s=window.total_seconds(),
        median_step_s=median,
        pause_factor=pause_factor,
        highest_step=max((s.step for s in ordered), default=None),
        steps_seen=len(ordered),
        restarts=_restarts(ordered, saves),
        incidents=[
            _incident_loss(i, ordered, times, intervals, saves, start=start, end=end, highs=highs)
            for i in sorted(incidents, key=lambda i: (i.opened_at, i.id))
        ],
        checkpoints=len({c.step for c in saves}),
        last_checkpoint_step=saves[-1].step if saves else None,
        series=series,
        stalls=stalls,
        lost=lost,
    )
