"""The escalation ladder on plain data: a node faulting again after each remedy climbs one rung each time; a remedy
that held starts the ladder again; the fatal and RMA counts raise the floor; faults of another family or of the
remedy's own burst do not count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ml.ladder import RUNGS, Fault, History, Remedy, Thresholds, climb, duration, ordinal, steps

T0 = datetime(2026, 11, 28, 10, 2, tzinfo=UTC)
LIMITS = Thresholds()  # defaults: hold 24 h, settle 120 s, a reboot from the 3rd fault in 24 h, RMA from 4 remedies


def _walk(base: str, gaps_s: list[float], family: str = "gpu_hardware") -> list[str]:
    """A node faulting at T0 and again after each gap; each fault's remedy is the rung the ladder gives, decided
    10 s after the fault. The rungs, in order."""
    remedies: list[Remedy] = []
    faults: list[Fault] = []
    at = T0
    rungs = []
    for gap in [0.0, *gaps_s]:
        at = at + timedelta(seconds=gap)
        faults.append(Fault(at, family))
        rung = climb(base, History(remedies, faults), family=family, at=at, thresholds=LIMITS)
        rungs.append(rung.name)
        remedies.append(Remedy(rung.name, at + timedelta(seconds=10), family))
    return rungs


def test_a_node_faulting_again_after_each_remedy_climbs_one_rung_each_time() -> None:
    assert _walk("restart", [1800.0] * 4) == list(RUNGS)
    # From a GPU reset (the evidence's own rung), three hours apart: reset, reboot, repair, RMA, and RMA stays the top.
    assert _walk("reset_gpu", [3 * 3600.0] * 4) == ["reset_gpu", "reboot", "repair", "rma", "rma"]


def test_the_reason_names_the_rung_the_count_and_the_remedy_that_did_not_hold() -> None:
    remedies = [Remedy("reset_gpu", T0, "gpu_hardware", 7)]
    faults = [Fault(T0 - timedelta(seconds=5), "gpu_hardware"), Fault(T0 + timedelta(hours=3), "gpu_hardware")]
    rung = climb(
        "reset_gpu", History(remedies, faults), family="gpu_hardware", at=T0 + timedelta(hours=3), thresholds=LIMITS
    )
    assert (rung.name, rung.number, rung.climbed) == ("reboot", 3, True)
    assert rung.describe() == (
        "rung 3 of 5 (reboot): 2nd GPU fault in 24 h, 3 h after the GPU reset at 10:02: it did not hold"
    )


def test_a_remedy_that_held_starts_the_ladder_again() -> None:
    # A reset, then 30 h without a GPU fault: the next fault is the evidence's rung again, a reset.
    assert _walk("reset_gpu", [30 * 3600.0, 30 * 3600.0]) == ["reset_gpu", "reset_gpu", "reset_gpu"]
    remedies = [Remedy("reboot", T0, "gpu_hardware")]
    at = T0 + timedelta(hours=30)
    rung = climb("reset_gpu", History(remedies, [Fault(at, "gpu_hardware")]), family="gpu_hardware", at=at,
                 thresholds=LIMITS)  # fmt: skip
    assert rung.name == "reset_gpu" and not rung.climbed
    assert rung.why == "the node reboot at 2026-11-28 10:02 held (30 h without a GPU fault): the ladder starts again"
    # A shorter hold time makes a 3-hour gap a remedy that held.
    short = Thresholds(hold_s=3600.0)
    at = T0 + timedelta(hours=3)
    rung = climb("reset_gpu", History(remedies, [Fault(at, "gpu_hardware")]), family="gpu_hardware", at=at,
                 thresholds=short)  # fmt: skip
    assert rung.name == "reset_gpu"


def test_a_fault_of_another_family_or_of_the_remedys_own_burst_does_not_climb() -> None:
    remedies = [Remedy("reset_gpu", T0, "gpu_hardware")]
    # An NVLink fault an hour after a GPU reset: the reset is not judged by it.
    at = T0 + timedelta(hours=1)
    rung = climb("repair", History(remedies, [Fault(at, "nvlink")]), family="nvlink", at=at, thresholds=LIMITS)
    assert (rung.name, rung.climbed) == ("repair", False)
    # Another line of the burst the reset was decided for, 30 s after it: the same fault.
    at = T0 + timedelta(seconds=30)
    rung = climb("reset_gpu", History(remedies, [Fault(at, "gpu_hardware")]), family="gpu_hardware", at=at,
                 thresholds=LIMITS)  # fmt: skip
    assert rung.name == "reset_gpu"


def test_the_evidence_sets_the_floor() -> None:
    # A reset that did not hold, but this fault needs a repair by its own evidence: repair, not reboot.
    remedies = [Remedy("reset_gpu", T0, "gpu_hardware")]
    at = T0 + timedelta(hours=1)
    rung = climb("repair", History(remedies, [Fault(at, "gpu_hardware")]), family="gpu_hardware", at=at,
                 thresholds=LIMITS)  # fmt: skip
    assert rung.name == "repair" and not rung.climbed


def test_the_fatal_count_asks_at_least_for_a_reboot() -> None:
    # Three GPU faults within 24 h, none after a remedy (nothing was done): the third asks for a reboot.
    faults = [Fault(T0 + timedelta(hours=h), "gpu_hardware") for h in (0, 5, 10)]
    at = faults[-1].at
    rung = climb("reset_gpu", History((), faults), family="gpu_hardware", at=at, thresholds=LIMITS)
    assert rung.name == "reboot"
    assert rung.why == "3rd GPU fault in 24 h (a reboot from the 3rd)"
    # Lines of one burst count once: three lines in a minute are one fault.
    burst = [Fault(T0 + timedelta(seconds=s), "gpu_hardware") for s in (0, 20, 40)]
    rung = climb("reset_gpu", History((), burst), family="gpu_hardware", at=burst[-1].at, thresholds=LIMITS)
    assert rung.name == "reset_gpu"
    # Configurable: from the 4th, three are not enough.
    rung = climb("reset_gpu", History((), faults), family="gpu_hardware", at=at, thresholds=Thresholds(fatal_count=4))
    assert rung.name == "reset_gpu"


def test_many_remedies_in_a_week_ask_for_a_vendor_replacement() -> None:
    # Four resets two days apart, each of which held: the fifth fault asks for an RMA all the same.
    remedies = [Remedy("reset_gpu", T0 + timedelta(days=2 * k), "gpu_hardware") for k in range(3)]
    remedies.append(Remedy("reset_gpu", T0 + timedelta(days=5), "nvlink"))
    at = T0 + timedelta(days=6, hours=12)
    history = History(remedies, [Fault(at, "gpu_hardware")])
    rung = climb("reset_gpu", history, family="gpu_hardware", at=at, thresholds=LIMITS)
    assert rung.name == "rma"
    assert rung.why == "4 remedies in 7 d (a vendor replacement from 4)"
    # Restarts are not machine remedies; fewer than the count is not enough.
    assert climb("reset_gpu", history, family="gpu_hardware", at=at, thresholds=Thresholds(rma_count=5)).name == (
        "reset_gpu"
    )


def test_steps_say_whether_each_remedy_held() -> None:
    remedies = [
        Remedy("reset_gpu", T0, "gpu_hardware"),
        Remedy("reboot", T0 + timedelta(hours=2), "gpu_hardware"),
        Remedy("repair", T0 + timedelta(hours=40), "gpu_hardware"),
    ]
    faults = [Fault(T0 + timedelta(hours=h), "gpu_hardware") for h in (0, 2, 39.9)]
    now = T0 + timedelta(hours=41)
    out = steps(History(remedies, faults), now=now, thresholds=LIMITS)
    assert [(s.remedy.rung, s.held, s.failed_at) for s in out] == [
        ("reset_gpu", False, T0 + timedelta(hours=2)),
        ("reboot", True, None),  # the next fault came 37.9 h later
        ("repair", None, None),  # an hour ago: too early to tell
    ]


def test_words() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd",
    ]  # fmt: skip
    assert [duration(s) for s in (40, 720, 3600, 11100, 7 * 86400)] == ["40 s", "12 min", "1 h", "3 h 5 min", "7 d"]
