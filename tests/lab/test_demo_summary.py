"""The demo's run summary (lab/demo_summary.py): fault windows, evictions of the faulty node, false
accusations; and `faultline demo`'s new flags refuse bad values before starting anything."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from lab.demo_summary import DecisionRow, format_summary, summarize
from tests.service.test_cli import faultline

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _at(s: float) -> str:
    return (T0 + timedelta(seconds=s)).isoformat()


TRUTH = {
    "started_at": _at(0),
    "faults": [
        {"kind": "gpu_lost", "nodes": ["n-1"], "injected_at": _at(60), "repaired_at": _at(700), "resolved_by": "evict",
         "expect_action": "evict"},
        {"kind": "nvlink", "nodes": ["n-2"], "injected_at": _at(300), "repaired_at": _at(420),
         "expect_action": "evict"},
    ],
    "loop": [{"kind": "swap_in", "node": "n-4"}, {"kind": "to_pool", "node": "n-1"}, {"kind": "restart", "node": "x"}],
}  # fmt: skip


def _d(i: int, kind: str, node: str | None, s: float, state: str = "done") -> DecisionRow:
    return DecisionRow(i, kind, node, state, T0 + timedelta(seconds=s))


def test_decisions_in_a_fault_window_hit_it_and_the_others_are_false_accusations() -> None:
    decisions = [
        _d(1, "evict", "n-1", 75),  # the faulty node, in its window
        _d(2, "evict", "n-0", 80, "rejected"),  # a healthy node: a false accusation
        _d(3, "diagnose", "n-2", 470),  # within the minute's grace after the nvlink fault's repair
        _d(4, "reset_gpu", "n-2", 600),  # long after it: false
        _d(5, "restart", None, 90),  # a job action names no node: not an accusation
        _d(6, "evict", "n-2", 100),  # before n-2's fault: false, and it does not count as evicting that fault
    ]
    s = summarize(TRUTH, decisions, open_incidents=1, incidents=3, ettr_ratio=0.91, now=T0 + timedelta(hours=1))
    assert s["faults"] == 2 and s["faults_expecting_eviction"] == 2 and s["faults_evicted"] == 1
    assert s["false_accusations"] == 3
    assert [d.split()[0] for d in s["false_accusation_details"]] == ["#2", "#4", "#6"]
    assert s["faults_resolved_by"] == {"evict": 1, "plan repair": 1}
    assert s["decisions"] == {"evict": 3, "diagnose": 1, "reset_gpu": 1, "restart": 1}
    assert (s["restarts_on_spares"], s["repairs_completed"], s["incidents_open"]) == (1, 1, 1)
    text = format_summary(s)
    assert "false accusations      3" in text and "job ETTR               0.910" in text


def test_an_unrepaired_fault_stays_open_until_now() -> None:
    truth = {"faults": [{"kind": "straggler", "nodes": ["n-3"], "injected_at": _at(0), "expect_action": "evict"}]}
    late = [_d(1, "evict", "n-3", 3000)]
    s = summarize(truth, late, open_incidents=0, incidents=1, ettr_ratio=None, now=T0 + timedelta(hours=1))
    assert s["false_accusations"] == 0 and s["faults_evicted"] == 1 and s["faults_resolved_by"] == {"open": 1}
    assert "job ETTR               n/a" in format_summary(s)


def test_demo_refuses_bad_flags(tmp_path: Path) -> None:
    for flags, message in (
        (["--duration", "soon"], "bad --duration 'soon'"),
        (["--spares", "-1"], "--spares must be >= 0"),
        (["--repair-time", "0"], "--repair-time must be > 0"),
    ):
        result = faultline("demo", "--data-dir", str(tmp_path / "d"), "--port", "18199", *flags)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "d").exists()  # nothing started


def test_demo_with_approvals_makes_evictions_wait_for_a_person_unless_told_otherwise() -> None:
    from lab.demo import policy_env

    # --approvals: no stand-in, so evictions and GPU resets await a person's Approve (issue 27's session).
    assert policy_env(simulate=True, scheduler=False, environ={}) == {
        "FAULTLINE_POLICY_APPROVAL_REQUIRED_FOR": '["evict", "reset_gpu"]'
    }
    assert policy_env(simulate=True, scheduler=False, environ={"FAULTLINE_POLICY_MODE": "shadow"}) == {}
    # The closed loop: the stand-in acts, and the hourly eviction share is lifted; a caller's setting wins.
    assert policy_env(simulate=True, scheduler=True, environ={}) == {"FAULTLINE_POLICY_MAX_EVICT_SHARE_PER_HOUR": "1.0"}
    assert policy_env(simulate=True, scheduler=True, environ={"FAULTLINE_POLICY_MAX_EVICT_SHARE_PER_HOUR": "0.5"}) == {}
    assert policy_env(simulate=False, scheduler=False, environ={}) == {}  # --no-sim: real agents, real policy
