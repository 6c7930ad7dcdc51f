"""The backtest replays the escalation ladder: a live history in which a GPU faulted again after each remedy (made
by the live decide step, each remedy carried out) replays rung for rung under the current policy, and a candidate
without the ladder, or with a shorter hold time, says what it would have done instead and why."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.decisions import backtest, overrides
from tests.service.decisions.test_ladder import NODE, T0, _carry_out, _fault, _job, _settings


def _history(session: Session) -> None:
    settings = _settings()
    job = _job(session)
    for k in range(4):
        at = T0 + timedelta(hours=2 * k)
        (decision,) = _fault(session, job, at, f"xid-{k}", settings)
        _carry_out(session, decision, at + timedelta(minutes=2), settings)


def _run(session: Session, **policy: Any) -> backtest.Backtest:
    current = _settings()
    with backtest.read_only(session):
        return backtest.run(
            session,
            settings=current,
            candidate=overrides.candidate(current, policy),
            since=T0 - timedelta(hours=1),
            until=T0 + timedelta(hours=12),
        )


def _rungs(verdicts: list[backtest.Verdict]) -> list[str]:
    return [f"{v.kind} {v.rails.get('ladder', '').split(':')[0]}" for v in verdicts]


def test_the_backtest_replays_the_ladder_rung_for_rung(session) -> None:
    _history(session)
    result = _run(session)
    assert [r.root_cause for r in result.incidents] == ["gpu_hardware"] * 4
    live = [_rungs(r.decided) for r in result.incidents]
    replayed = [_rungs(r.candidate) for r in result.incidents]
    assert live == [
        ["reset_gpu rung 2 of 5 (reset_gpu)"],
        ["evict rung 3 of 5 (reboot)"],
        ["evict rung 4 of 5 (repair)"],
        ["evict rung 5 of 5 (rma)"],
    ]
    # The current policy's replay climbs the same rungs, from the replay's own remedies.
    assert replayed == live
    assert all(not r.differences for r in result.incidents)
    assert result.incidents[2].candidate[0].rails["ladder"] == (
        "rung 4 of 5 (repair): 3rd GPU fault in 24 h, 2 h after the node reboot at 10:00: it did not hold"
    )


def test_a_candidate_without_the_ladder_or_with_a_short_hold_says_what_changes(session) -> None:
    _history(session)
    off = _run(session, policy_ladder_enabled=False)
    # The backtest does not replay the GPU reset limit's count: without the ladder every fault is a reset again.
    assert [[v.kind for v in r.candidate] for r in off.incidents] == [["reset_gpu"]] * 4
    second = off.incidents[1]
    assert [(d.kind, d.node, d.change) for d in second.differences] == [
        ("evict", NODE, "removed"),
        ("reset_gpu", NODE, "added"),
    ]
    assert "current policy: evict ld-1 (pending) [" in second.differences[0].why
    assert "ladder: rung 3 of 5 (reboot)" in second.differences[0].why
    assert off.changed_settings == {"policy_ladder_enabled": (True, False)}

    # A one-hour hold: each remedy held (the next fault came two hours later), so the second fault is a reset again;
    # from the third GPU fault in 24 h on, the fatal count asks for a reboot all the same.
    short = _run(session, policy_ladder_hold_s=3600)
    assert [_rungs(r.candidate) for r in short.incidents] == [
        ["reset_gpu rung 2 of 5 (reset_gpu)"],
        ["reset_gpu rung 2 of 5 (reset_gpu)"],
        ["evict rung 3 of 5 (reboot)"],
        ["evict rung 3 of 5 (reboot)"],
    ]
    assert short.incidents[1].candidate[0].rails["ladder"] == (
        "rung 2 of 5 (reset_gpu): the GPU reset at 08:00 held (2 h without a GPU fault): the ladder starts again"
    )
    assert short.incidents[2].candidate[0].rails["ladder"] == (
        "rung 3 of 5 (reboot): 3rd GPU fault in 24 h (a reboot from the 3rd)"
    )
    assert [(d.kind, d.change) for d in short.incidents[1].differences] == [
        ("evict", "removed"),
        ("reset_gpu", "added"),
    ]
