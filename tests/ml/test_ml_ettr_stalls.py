"""ml/ettr: lost time cut into stalls, each charged once to the incident that caused it, adding up to the ETTR's
lost time (issue 40: one 14-minute stall was charged to five incidents, one opened 63 s before its end)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ml.ettr import CheckpointSave, IncidentSpan, StepRecord, cause, compute

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _steps(first: int, last: int, *, at: float, every: float = 10.0) -> list[StepRecord]:
    return [StepRecord(_t(at + every * i), step) for i, step in enumerate(range(first, last + 1))]


def test_one_stall_overlapping_two_incidents_is_charged_once_to_the_one_that_opened_first_in_it() -> None:
    # Steps 1-30 every 10 s (to 290 s); the job stops after step 30, restarts from the checkpoint of step 20 at 600 s
    # and is back past 30 at 710 s, then trains on to 800 s. Incident 1 (a straggler) was open before the stall and
    # while the job still trained; 2 opened 5 s into the stall (the Xid that stopped it); 3 opened 63 s before the
    # stall ended (a symptom).
    steps = _steps(1, 30, at=0) + _steps(21, 39, at=600)
    incidents = [
        IncidentSpan(1, _t(100), _t(650)),
        IncidentSpan(2, _t(295), _t(620)),
        IncidentSpan(3, _t(647), None),
    ]
    r = compute(steps, start=_t(0), end=_t(780), incidents=incidents, checkpoints=[CheckpointSave(_t(200), 20)])
    charged = [s for s in r.stalls if s.incident_id is not None]
    (stall,) = charged
    # From step 30 (290 s) to step 30 again (690 s): down to step 21 at 600 s, then redoing 21-30.
    assert (stall.start, stall.end, stall.incident_id) == (_t(290), _t(690), 2)
    assert stall.also == (1, 3) and stall.restarts == 1 and stall.checkpoint_step == 20
    assert (stall.step_reached, stall.resumed_step, stall.steps_redone) == (30, 21, 10)
    assert (stall.lost_s, stall.down_s, stall.redone_s) == (pytest.approx(400), pytest.approx(310), pytest.approx(90))
    assert r.lost is not None and r.lost.by_incident == {2: pytest.approx(400)}


def test_the_parts_add_up_to_wall_times_one_minus_ettr() -> None:
    # Start-up 30 s, a checkpoint pause (60 s between steps 10 and 11 at a 10 s pace), an outage charged to an
    # incident, and 4 s since the last step line (not yet due).
    steps = _steps(1, 10, at=30) + _steps(11, 20, at=180) + _steps(15, 30, at=500)
    incidents = [IncidentSpan(5, _t(280), _t(700))]
    r = compute(steps, start=_t(0), end=_t(654), incidents=incidents, checkpoints=[CheckpointSave(_t(150), 14)])
    lost = r.lost
    assert lost is not None
    wall, ratio = r.cumulative.wall_s, r.cumulative.ratio
    assert ratio is not None
    assert lost.total_s == pytest.approx(wall * (1 - ratio))
    assert lost.charged_s + lost.startup_s + lost.unexplained_s + lost.pending_s == pytest.approx(lost.total_s)
    assert lost.startup_s == pytest.approx(30) and lost.unexplained_s == pytest.approx(50)
    assert lost.pending_s == pytest.approx(4) and set(lost.by_incident) == {5}
    assert sum(s.lost_s for s in r.stalls) + lost.pending_s == pytest.approx(lost.total_s)


def test_a_pause_is_not_charged_to_an_incident_opened_before_it_but_an_outage_is() -> None:
    # A straggler incident open since 50 s: the 60 s checkpoint pause at 100-160 s (one slow interval that still
    # advanced) is the job's own; the outage from 250 s, a restart with no incident of its own (its hang incident was
    # merged into the straggler's), is the open one's.
    steps = _steps(1, 10, at=10) + _steps(11, 20, at=160) + _steps(16, 25, at=600)
    incidents = [IncidentSpan(8, _t(50), None)]
    r = compute(steps, start=_t(0), end=_t(640), incidents=incidents)
    pause, outage = [s for s in r.stalls if not s.startup]
    assert pause.incident_id is None and pause.also == (8,)
    assert outage.incident_id == 8 and outage.restarts == 1 and outage.also == ()


def test_an_ongoing_stall_runs_to_the_end_and_takes_an_incident_opened_at_it() -> None:
    steps = _steps(1, 10, at=10)
    r = compute(steps, start=_t(0), end=_t(400), incidents=[IncidentSpan(3, _t(400), None)])
    stall = r.stalls[-1]
    assert stall.ongoing and stall.end == _t(400) and stall.incident_id == 3
    assert stall.lost_s == pytest.approx(300)


def test_the_wait_for_the_next_step_line_is_not_a_stall_until_it_is_overdue() -> None:
    steps = _steps(1, 10, at=10)
    due = compute(steps, start=_t(10), end=_t(113))
    assert [s for s in due.stalls if not s.startup] == [] and due.lost is not None and due.lost.pending_s == 13
    late = compute(steps, start=_t(10), end=_t(200))
    assert late.stalls[-1].ongoing and late.stalls[-1].lost_s == pytest.approx(100)


def test_cause_prefers_the_first_to_open_within_then_the_newest_open_at_the_start() -> None:
    spans = [IncidentSpan(1, _t(0), None), IncidentSpan(2, _t(50), _t(60)), IncidentSpan(3, _t(120), None)]
    assert cause(spans, start=_t(100), end=_t(200)) == (3, (1,))
    assert cause(spans, start=_t(100), end=_t(110)) == (1, ())
    assert cause(spans, start=_t(100), end=_t(110), pause=True) == (None, (1,))
    assert cause(spans, start=_t(100), end=_t(120)) == (1, ())  # opened at the end: not within
    assert cause(spans, start=_t(100), end=_t(120), ongoing=True) == (3, (1,))
    assert cause([], start=_t(0), end=_t(1)) == (None, ())


def test_a_job_without_step_lines_has_its_whole_span_as_one_start_up_stall() -> None:
    r = compute([], start=_t(0), end=_t(60), incidents=[IncidentSpan(4, _t(10), None)])
    (stall,) = r.stalls
    assert stall.startup and stall.incident_id == 4 and stall.lost_s == 60
    assert r.cumulative.ratio is None
