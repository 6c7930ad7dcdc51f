"""ml/stalls: why a job has made no net progress, from plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ml import stalls
from ml.ettr import CheckpointSave, StepRecord

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _run(first: int, last: int, *, at: float) -> list[StepRecord]:
    return [StepRecord(_t(at + 10 * i), s) for i, s in enumerate(range(first, last + 1))]


def _evict(state: str, *, at: float, acked: float | None = None, message: str | None = None) -> stalls.Action:
    acked_at = _t(acked) if acked is not None else None
    return stalls.Action(12, "evict", "node-5", None, state, _t(at), acked_at, message)


def test_restarting_from_the_same_checkpoint_again_and_again() -> None:
    # Reached 400 at 0 s; three restarts, each back to 301 (checkpoint 300), never past 400; still stepping.
    steps = [StepRecord(_t(0), 400), *_run(301, 350, at=100), *_run(301, 380, at=700), *_run(301, 320, at=1600)]
    why = stalls.explain(
        high=400, since=_t(0), now=_t(1795), steps=steps, checkpoints=[CheckpointSave(_t(-60), 300)], processes_alive=64
    )
    assert why.kind == stalls.RESTART_LOOP and why.restarts == 3 and why.restart_steps == (301, 301, 301)
    assert "each back to step 301, never past step 400" in why.text
    assert why.checkpoint_step == 300 and why.last_step == 320


def test_waiting_for_a_spare_after_an_eviction_with_no_step_since() -> None:
    steps = [StepRecord(_t(0), 400), *_run(301, 310, at=60)]
    evicted = _evict("done", at=200, acked=205, message="node rank 3: waiting for a spare")
    why = stalls.explain(high=400, since=_t(0), now=_t(800), steps=steps, actions=[evicted], processes_alive=0)
    assert why.kind == stalls.WAITING_FOR_SPARE and why.action_id == 12
    assert "node-5 evicted" in why.text and why.details[0] == "the scheduler said: node rank 3: waiting for a spare"


def test_a_remedy_waiting_for_a_scheduler_or_a_person_comes_first() -> None:
    steps = [StepRecord(_t(0), 400)]
    why = stalls.explain(high=400, since=_t(0), now=_t(700), steps=steps, actions=[_evict("pending", at=30)])
    assert why.kind == stalls.WAITING_FOR_ACTION and "waiting for a scheduler: eviction of node-5" in why.text
    reset = stalls.Action(13, "reset_gpu", "node-5", 3, "awaiting_approval", _t(40), None, None)
    why = stalls.explain(high=400, since=_t(0), now=_t(700), steps=steps, actions=[reset])
    assert "a person's approval: reset of GPU 3 on node-5 (decision #13)" in why.text


def test_hung_with_processes_alive_down_without_and_silent_when_unknown() -> None:
    steps = [StepRecord(_t(0), 400)]
    hung = stalls.explain(high=400, since=_t(0), now=_t(700), steps=steps, processes_alive=62, world_size=64)
    assert (
        hung.kind == stalls.HUNG
        and "62 of 64 processes alive" in hung.text
        and "no step since 03:00:00 UTC" in hung.text
    )
    down = stalls.explain(high=400, since=_t(0), now=_t(700), steps=steps, processes_alive=0)
    assert down.kind == stalls.DOWN and "no training process reports" in down.text
    silent = stalls.explain(high=400, since=_t(0), now=_t(700), steps=steps)
    assert silent.kind == stalls.DOWN and silent.text.startswith("silent")


def test_an_eviction_before_the_last_step_is_no_reason_to_wait() -> None:
    # Evicted at 100 s, a spare joined and the job stepped until 650 s: it is stepping, catching up after its restart.
    steps = [StepRecord(_t(0), 400), *_run(301, 356, at=100)]
    why = stalls.explain(high=400, since=_t(0), now=_t(660), steps=steps, actions=[_evict("done", at=90, acked=95)])
    assert why.kind == stalls.CATCHING_UP and "at step 356 of 400" in why.text


def test_logging_steps_without_passing_the_mark_and_no_restart() -> None:
    steps = [StepRecord(_t(0), 400), StepRecord(_t(650), 400)]
    why = stalls.explain(high=400, since=_t(0), now=_t(660), steps=steps)
    assert why.kind == stalls.NO_PROGRESS and why.restarts == 0
