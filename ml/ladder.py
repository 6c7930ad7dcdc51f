"""The escalation ladder: a node's remedy history in, the rung its next remedy should stand on (and why) out.

GPUd and NVSentinel escalate the same way: restart the application, reset the GPU, reboot the node, take it out for
repair, replace it (RMA). A remedy "did not hold" when the node faults again with a finding of the same family
(its root-cause category: gpu_hardware, nvlink, ...) within `hold_s` of it; the next remedy then stands one rung
above it. A remedy that held sends the next fault back to the rung its own evidence asks for. Two counts raise the
floor: `fatal_count` faults of the family within `fatal_window_s` ask at least for a reboot, and `rma_count`
machine remedies (a reset or more) within `rma_window_s` for a vendor replacement.

Pure: plain data in, no database, no settings; the service reads the history (service/nodes/ladder.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

# Lowest first. Each is how a decision carries it out: restart (the job), reset_gpu, and an eviction for the three
# that take the node out of service (the scheduler's part is the same; people reboot, repair or replace it).
RUNGS = ("restart", "reset_gpu", "reboot", "repair", "rma")
WORDS = {
    "restart": "an application restart",
    "reset_gpu": "a GPU reset",
    "reboot": "a node reboot",
    "repair": "a repair",
    "rma": "a vendor replacement (RMA)",
}
NO_REMEDY = "no earlier remedy for this fault"
# What a person reads for a root-cause family: "2nd GPU fault in 24 h".
_FAMILY_WORDS = {
    "gpu_hardware": "GPU fault",
    "nvlink": "NVLink fault",
    "pcie": "PCIe fault",
    "network": "network fault",
    "host": "host fault",
    "storage": "storage fault",
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    hold_s: float = 86400.0  # a fault of the same family within this after a remedy: it did not hold
    settle_s: float = 120.0  # faults this close to a remedy (or to each other) are the same burst
    fatal_count: int = 3  # this many faults of a family within fatal_window_s: at least a reboot
    fatal_window_s: float = 86400.0
    rma_count: int = 4  # this many machine remedies (reset or more) within rma_window_s: a vendor replacement
    rma_window_s: float = 7 * 86400.0

    @property
    def lookback_s(self) -> float:
        """How far back the history must reach."""
        return max(self.hold_s, self.fatal_window_s, self.rma_window_s) + self.settle_s


@dataclass(frozen=True, slots=True)
class Remedy:
    """A remedy decided for the node: its rung, when it took effect, for which family of fault."""

    rung: str  # one of RUNGS
    at: datetime
    family: str
    decision_id: int | None = None
    state: str = "done"


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault the node showed: when, and its family."""

    at: datetime
    family: str


@dataclass(frozen=True, slots=True)
class History:
    remedies: Sequence[Remedy] = ()
    faults: Sequence[Fault] = ()
    # When the node went out for a vendor replacement, where a caller keeps it to cut the history itself.
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One remedy on the ladder as a person reads it: whether it held."""

    remedy: Remedy
    held: bool | None  # None: too early to tell (within hold_s, no fault yet)
    failed_at: datetime | None  # the fault that showed it did not hold


@dataclass(frozen=True, slots=True)
class Rung:
    name: str  # one of RUNGS
    base: str  # the rung the evidence alone asked for
    why: str  # "2nd GPU fault in 24 h, 3 h after a GPU reset at 10:02 that did not hold"

    @property
    def number(self) -> int:
        return RUNGS.index(self.name) + 1

    @property
    def climbed(self) -> bool:
        return RUNGS.index(self.name) > RUNGS.index(self.base)

    def describe(self) -> str:
        """ "rung 3 of 5 (reboot): ..." """
        return f"rung {self.number} of {len(RUNGS)} ({self.name}): {self.why}"


def family_words(family: str) -> str:
    return _FAMILY_WORDS.get(family, f"{family} fault")


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def duration(seconds: float) -> str:
    """ "3 h 5 min", "12 min", "40 s", "2 d" """
    s = int(max(0.0, seconds))
    if s >= 2 * 86400 and s % 86400 == 0:
        return f"{s // 86400} d"
    if s >= 3600:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


def _clock(t: datetime, now: datetime) -> str:
    """10:02 the same day, else 2026-11-28 10:02 (UTC, as every page shows times)."""
    return f"{t:%H:%M}" if t.date() == now.date() else f"{t:%Y-%m-%d %H:%M}"


def _bursts(times: Sequence[datetime], settle_s: float) -> list[datetime]:
    """Fault times with those within settle_s of the previous one merged: one fault, many lines."""
    out: list[datetime] = []
    for t in sorted(times):
        if not out or (t - out[-1]).total_seconds() > settle_s:
            out.append(t)
    return out


def _faults(history: History, family: str, since: datetime, until: datetime, settle_s: float) -> list[datetime]:
    return _bursts([f.at for f in history.faults if f.family == family and since <= f.at <= until], settle_s)


def steps(history: History, *, now: datetime, thresholds: Thresholds) -> list[Step]:
    """Each remedy, oldest first, and whether it held: a fault of its family after it settled, within hold_s."""
    out = []
    for r in sorted(history.remedies, key=lambda r: r.at):
        start, end = r.at + timedelta(seconds=thresholds.settle_s), r.at + timedelta(seconds=thresholds.hold_s)
        after = [f.at for f in history.faults if f.family == r.family and start < f.at <= end]
        if after:
            out.append(Step(r, False, min(after)))
        else:
            out.append(Step(r, None if now < end else True, None))
    return out


def climb(base: str, history: History, *, family: str, at: datetime, thresholds: Thresholds) -> Rung:
    """The rung for a fault of `family` at `at` whose evidence alone asks for `base`.

    The last remedy for this family decided before the fault (settled: not of the fault's own burst): if the fault
    came within hold_s of it, it did not hold and the rung is one above it; otherwise the ladder starts again at
    `base`. Never below `base`; the fatal and RMA counts raise the floor."""
    settle = timedelta(seconds=thresholds.settle_s)
    window = timedelta(seconds=thresholds.fatal_window_s)
    # The fault itself counts, once however many lines it took.
    fatal = _bursts([*_faults(history, family, at - window, at, thresholds.settle_s), at], thresholds.settle_s)
    before = [r for r in history.remedies if r.family == family and r.at + settle < at]
    floor = RUNGS.index(base)
    rung, why = floor, NO_REMEDY
    if before:
        last = max(before, key=lambda r: r.at)
        gap = (at - last.at).total_seconds()
        when = f"{WORDS[last.rung].removeprefix('a ').removeprefix('an ')} at {_clock(last.at, at)}"
        if gap <= thresholds.hold_s:
            rung = max(floor, min(RUNGS.index(last.rung) + 1, len(RUNGS) - 1))
            why = (
                f"{ordinal(len(fatal))} {family_words(family)} in {duration(thresholds.fatal_window_s)}, "
                f"{duration(gap)} after the {when}: it did not hold"
            )
        else:
            why = f"the {when} held ({duration(gap)} without a {family_words(family)}): the ladder starts again"
    reboot = RUNGS.index("reboot")
    if len(fatal) >= thresholds.fatal_count and rung < reboot:
        rung = reboot
        why = (
            f"{ordinal(len(fatal))} {family_words(family)} in {duration(thresholds.fatal_window_s)} "
            f"(a reboot from the {ordinal(thresholds.fatal_count)})"
        )
    since = at - timedelta(seconds=thresholds.rma_window_s)
    machine = [r for r in history.remedies if since <= r.at and r.at + settle < at and RUNGS.index(r.rung) >= 1]
    if len(machine) >= thresholds.rma_count and rung < len(RUNGS) - 1:
        rung = len(RUNGS) - 1
        why = (
            f"{len(machine)} remedies in {duration(thresholds.rma_window_s)} "
            f"(a vendor replacement from {thresholds.rma_count})"
        )
    return Rung(RUNGS[rung], base, why)
