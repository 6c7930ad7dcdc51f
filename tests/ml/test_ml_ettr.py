"""ml/ettr: productive time, restarts, redone steps, pauses and the time each incident lost, by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ml.ettr import CheckpointSave, IncidentSpan, StepRecord, compute, median_step_s

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# Steps 1-10 every 10 s; a checkpoint of step 5; an incident at 105 s; the job restarts from the checkpoint and logs
# step 6 at 200 s, gets back to 10 at 240 s, then 11 at 250 s, a 50 s pause (a save) before 12, and 13 at 310 s.
STEPS = (
    [StepRecord(_t(10 * k), k) for k in range(1, 11)]
    + [StepRecord(_t(200 + 10 * i), 6 + i) for i in range(6)]  # 6..11 at 200..250
    + [StepRecord(_t(300), 12), StepRecord(_t(310), 13)]
)
CHECKPOINTS = [CheckpointSave(_t(52), 5)]
INCIDENT = IncidentSpan(id=7, opened_at=_t(105), resolved_at=_t(260))


def _report(**kw):  # type: ignore[no-untyped-def]
    return compute(
        STEPS,
        start=_t(0),
        end=_t(320),
        incidents=[INCIDENT],
        checkpoints=CHECKPOINTS,
        pause_factor=3.0,
        **kw,
    )


def test_cumulative_ettr_by_hand() -> None:
    r = _report(window=timedelta(seconds=100))
    # Forward intervals: 9 + 5 of 10 s, one of 50 s, one of 10 s: median 10 s per step.
    assert r.median_step_s == 10
    # Productive: 10->100 s (steps 2-10) 90 s; 240->250 s (step 11, past the high-water mark 10) 10 s;
    # 250->300 s is a pause (50 s > 3 x 10 s): step 12 counts its median 10 s; 300->310 s 10 s. Total 120 s.
    # Not productive: 0->10 s (before the first step), 100->200 s (down), 200->240 s (steps 7-10 redone).
    assert r.cumulative.productive_s == pytest.approx(120)
    assert r.cumulative.wall_s == 320
    assert r.cumulative.ratio == pytest.approx(120 / 320)
    # Sliding 100 s window [220, 320]: 220-240 redone, 240-250 10 s, 250-300 10 s, 300-310 10 s, 310-320 none.
    assert r.window.productive_s == pytest.approx(30)
    assert r.window.ratio == pytest.approx(0.3)
    assert r.highest_step == 13 and r.steps_seen == 18
    assert r.checkpoints == 1 and r.last_checkpoint_step == 5


def test_restart_and_incident_loss_by_hand() -> None:
    r = _report()
    assert [(x.ts, x.from_step, x.to_step, x.checkpoint_step) for x in r.restarts] == [(_t(200), 10, 6, 5)]
    (loss,) = r.incidents
    assert loss.id == 7
    assert loss.last_productive_at == _t(100)  # step 10
    assert loss.resumed_at == _t(200) and loss.resumed_step == 6
    assert loss.productive_again_at == _t(250)  # step 11: the first past step 10
    assert loss.step_reached == 10 and loss.checkpoint_step == 5
    assert loss.steps_redone == 5  # steps 6-10, from the checkpoint of step 5
    assert (loss.lost_s, loss.down_s, loss.redone_s) == (150, 100, 50)
    assert not loss.ongoing


def test_series_is_cumulative_and_windowed() -> None:
    r = _report(window=timedelta(seconds=100), points=5)  # every 80 s
    assert [p.ts for p in r.series] == [_t(80), _t(160), _t(240), _t(320)]
    # At 80 s: 70 s productive (10->80); at 160: 90; at 240: 90; at 320: 120.
    assert [p.cumulative for p in r.series] == pytest.approx([70 / 80, 90 / 160, 90 / 240, 120 / 320])
    # Windows [0, 80] (80 s long from the start), [60, 160], [140, 240], [220, 320].
    assert [p.window for p in r.series] == pytest.approx([70 / 80, 40 / 100, 0, 30 / 100])


def test_an_incident_the_job_is_still_down_from_loses_until_the_end() -> None:
    steps = [StepRecord(_t(10 * k), k) for k in range(1, 6)]
    r = compute(steps, start=_t(0), end=_t(200), incidents=[IncidentSpan(1, _t(55))])
    (loss,) = r.incidents
    assert loss.ongoing and loss.resumed_at is None
    assert loss.last_productive_at == _t(50)
    assert loss.lost_s == 150 and loss.down_s == 150 and loss.redone_s == 0
    assert r.cumulative.productive_s == 40


def test_an_incident_that_did_not_stop_the_job_costs_one_step() -> None:
    steps = [StepRecord(_t(10 * k), k) for k in range(1, 11)]
    r = compute(steps, start=_t(10), end=_t(100), incidents=[IncidentSpan(1, _t(55))])
    (loss,) = r.incidents
    assert (loss.last_productive_at, loss.productive_again_at, loss.lost_s) == (_t(50), _t(60), 10)
    assert r.cumulative.ratio == 1.0 and r.restarts == []


def test_repeated_records_and_unknown_progress() -> None:
    # Two ranks logging the same steps: repeats neither count twice nor look like a restart.
    steps = [StepRecord(_t(10 * k + d), k) for k in range(1, 5) for d in (0, 1)]
    r = compute(steps, start=_t(10), end=_t(41))
    assert r.restarts == [] and r.cumulative.productive_s == pytest.approx(30)
    none = compute([], start=_t(0), end=_t(60), incidents=[IncidentSpan(1, _t(5))])
    assert none.cumulative.ratio is None and none.window.ratio is None and none.median_step_s is None
    assert none.incidents[0].lost_s == 60 and none.incidents[0].ongoing
    assert median_step_s([StepRecord(_t(0), 0), StepRecord(_t(30), 10)]) == 3


def test_the_simulator_s_restart_from_its_checkpoint_through_the_agent_s_parser() -> None:
    """The sim's Megatron log (saves, a restart 30 s down) parsed as the agent does: ETTR sees the same restart."""
    from agents.parsers.training import TrainingLogParser
    from tests.lab.sim.test_sim_realism import START_AT, Run, cluster

    c = cluster(
        checkpoint_every_s=100.0,
        checkpoint_s=(10.0, 10.0),
        restart_every_s=1000.0,
        first_restart_s=110.0,
        restart_down_s=(30.0, 30.0),
    )
    r = Run(c).run(250)
    restart = next(e for e in c.ground_truth()["realism"]["events"] if e["kind"] == "restart")
    parser = TrainingLogParser()
    events = [e for t, line in r.train("node-000") for e in parser.feed(line, now=START_AT + timedelta(seconds=t))]
    steps = [StepRecord(e.ts, e.fields["step"]) for e in events if e.kind == "step" and e.rank == 0]
    saves = [CheckpointSave(e.ts, e.fields["step"]) for e in events if e.kind == "checkpoint_saved"]
    opened = START_AT + timedelta(seconds=restart["t"])
    report = compute(
        steps,
        start=START_AT,
        end=START_AT + timedelta(seconds=250),
        checkpoints=saves,
        incidents=[IncidentSpan(1, opened)],
    )
    (seen,) = report.restarts
    assert (seen.from_step, seen.to_step, seen.checkpoint_step) == (
        restart["iteration"],
        restart["from_iteration"] + 1,
        restart["from_iteration"],
    )
    (loss,) = report.incidents
    assert loss.steps_redone == restart["iteration"] - restart["from_iteration"]
    # Down: 30 s without processes, the checkpoint load, the first step; redone: about a step's time per step.
    load_s = c.config.realism_params.restart_load_s
    assert 30 + load_s <= loss.down_s <= 30 + load_s + 3 * report.median_step_s
    assert loss.redone_s == pytest.approx(loss.steps_redone * report.median_step_s, rel=0.35)
    assert loss.lost_s == pytest.approx(loss.down_s + loss.redone_s)
