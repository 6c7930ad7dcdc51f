"""Backtesting a policy: stored incidents replayed through a stricter and a looser policy, explained, read-only.

The history is made by the live decide step itself (diagnosis.service._decide: store findings, demarcate, open
incidents, decide), one pass at a time on a simulated clock, so the current policy's replay must reproduce it.

Three incidents (defaults: evict at 0.80, diagnose at 0.50; 8 nodes a job, so 2 evictions an hour):
  A  job bt-a, gpu_hardware on a-1, 0.90 at T0                 -> evict a-1 at +0 s
  B  job bt-a, host on a-2, 0.70 at T0+600 s                    -> diagnose a-2 at +0 s (below 0.80)
  C  job bt-c, gpu_hardware on c-3, 0.40 at T1, 0.75 at T1+30 s -> nothing, then evict c-3 at +30 s
     (two findings about one node: 1 - 0.60 * 0.25 = 0.85)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ml.demarcation import demarcate
from ml.findings import Finding as MlFinding
from service.config import Settings, get_settings
from service.decisions import backtest, backtest_report, overrides
from service.decisions.service import _context
from service.diagnosis import service as diagnosis
from service.errors import InvalidInput
from service.models import Decision, Finding, Incident, Job, Node
from service.ui.views import policy_form
from tests.conftest import count

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=2)
SINCE = T0 - timedelta(days=1)
UNTIL = T0 + timedelta(days=1)


def _settings() -> Settings:
    return get_settings()


def _finding(node: str, category: str, confidence: float, at: datetime, key: str) -> MlFinding:
    return MlFinding(
        detector="test",
        category=category,
        subject_kind="node",
        subject=node,
        confidence=confidence,
        summary=f"{category} on {node} ({confidence:.2f})",
        observed_at=at,
        node=node,
        blame="infrastructure",
        role="cause",
        action="evict",
        key=key,
    )


def _job(session: Session, name: str) -> Job:
    job = Job(external_id=name, source="registered", world_size=64)
    session.add(job)
    session.flush()
    for k in range(1, 9):
        session.add(Node(name=f"{name.removeprefix('bt-')}-{k}", current_job_id=job.id))
    session.flush()
    return job


def _live_pass(session: Session, job: Job, findings: list[MlFinding], at: datetime) -> None:
    """The live decide step at `at`; the rows it made carry the transaction's time, so they get the pass's."""
    result = diagnosis.DiagnosisResult(job_id=job.external_id)
    diagnosis._decide(session, job=job, findings=findings, result=result, settings=_settings(), now=at)
    session.execute(update(Finding).where(Finding.created_at == func.now()).values(created_at=at))
    session.execute(update(Incident).where(Incident.opened_at == func.now()).values(opened_at=at))
    session.execute(update(Decision).where(Decision.created_at == func.now()).values(created_at=at))
    session.flush()
    session.expire_all()


def _history(session: Session) -> None:
    a, c = _job(session, "bt-a"), _job(session, "bt-c")
    _live_pass(session, a, [_finding("a-1", "gpu_hardware", 0.90, T0, "a1")], T0)
    _live_pass(session, a, [_finding("a-2", "host", 0.70, T0, "a2")], T0 + timedelta(seconds=600))
    _live_pass(session, c, [_finding("c-3", "gpu_hardware", 0.40, T1, "c3a")], T1)
    _live_pass(session, c, [_finding("c-3", "gpu_hardware", 0.75, T1, "c3b")], T1 + timedelta(seconds=30))


def _run(session: Session, **policy: Any) -> backtest.Backtest:
    current = _settings()
    with backtest.read_only(session):
        return backtest.run(
            session, settings=current, candidate=overrides.candidate(current, policy), since=SINCE, until=UNTIL
        )


def _summary(result: backtest.Backtest) -> list[tuple[str, list[str], list[str], list[tuple[str, str | None, str]]]]:
    return [
        (
            r.root_cause,
            [f"{v.kind} {v.node} +{(v.at - r.opened_at).total_seconds():.0f}" for v in r.decided],
            [f"{v.kind} {v.node} +{(v.at - r.opened_at).total_seconds():.0f}" for v in r.candidate],
            [(d.kind, d.node, d.change) for d in r.differences],
        )
        for r in result.incidents
    ]


def test_the_current_policy_replays_the_live_history_exactly(session) -> None:
    _history(session)
    result = _run(session)
    assert _summary(result) == [
        ("gpu_hardware", ["evict a-1 +0"], ["evict a-1 +0"], []),
        ("host", ["diagnose a-2 +0"], ["diagnose a-2 +0"], []),
        ("gpu_hardware", ["evict c-3 +30"], ["evict c-3 +30"], []),
    ]
    assert [r.steps for r in result.incidents] == [1, 1, 2]
    assert result.totals.changed_incidents == 0 and result.changed_settings == {}


def test_a_stricter_policy_removes_evictions_and_says_which_threshold(session) -> None:
    _history(session)
    result = _run(session, policy_evict_min_confidence=0.95)
    assert _summary(result) == [
        (
            "gpu_hardware",
            ["evict a-1 +0"],
            ["diagnose a-1 +0"],
            [("diagnose", "a-1", "added"), ("evict", "a-1", "removed")],
        ),
        ("host", ["diagnose a-2 +0"], ["diagnose a-2 +0"], []),
        (
            "gpu_hardware",
            ["evict c-3 +30"],
            ["diagnose c-3 +30"],
            [("diagnose", "c-3", "added"), ("evict", "c-3", "removed")],
        ),
    ]
    removed = result.incidents[0].differences[1]
    assert "current policy: evict a-1 (pending) [blast_radius: 0 evicted in the last hour" in removed.why
    assert "confidence: 90% >= 80%" in removed.why
    assert "candidate: diagnose a-1 (pending) [confidence: 90% below the eviction threshold 95%]" in removed.why
    t = result.totals
    assert (t.evictions, t.evictions_added, t.evictions_removed) == ((2, 0), 0, 2)
    assert (t.diagnoses, t.approvals, t.changed_incidents) == ((1, 3), (0, 0), 2)
    assert result.changed_settings == {"policy_evict_min_confidence": (0.8, 0.95)}


def test_a_looser_policy_adds_an_eviction_and_decides_sooner(session) -> None:
    _history(session)
    result = _run(session, evict_min_confidence=0.65, FAULTLINE_POLICY_DIAGNOSE_MIN_CONFIDENCE="0.35")
    assert _summary(result) == [
        ("gpu_hardware", ["evict a-1 +0"], ["evict a-1 +0"], []),
        (
            "host",
            ["diagnose a-2 +0"],
            ["evict a-2 +0"],
            [("diagnose", "a-2", "removed"), ("evict", "a-2", "added")],
        ),
        ("gpu_hardware", ["evict c-3 +30"], ["diagnose c-3 +0", "evict c-3 +30"], [("diagnose", "c-3", "added")]),
    ]
    added = result.incidents[1].differences[1]
    assert "current policy: diagnose a-2 (pending) [confidence: 70% below the eviction threshold 80%]" in added.why
    assert "candidate: evict a-2 (pending) [blast_radius: 1 evicted in the last hour, within the limit" in added.why
    t = result.totals
    assert (t.evictions, t.evictions_added, t.evictions_removed) == ((2, 3), 1, 0)
    assert t.diagnoses == (1, 1)
    # First decisions: decided 0, 0, 30 s; candidate 0, 0, 0 s. p95 by nearest rank of three is the largest.
    assert (t.ttd_median_s, t.ttd_p95_s) == ((0.0, 0.0), (30.0, 0.0))


def test_blast_radius_and_approval_modes_are_replayed(session) -> None:
    _history(session)
    # 1 of 8 nodes an hour: A's eviction uses job bt-a's budget, so a looser B waits for a person.
    result = _run(session, policy_evict_min_confidence=0.65, policy_max_evict_share_per_hour=0.125)
    (b_added,) = [d for d in result.incidents[1].differences if d.kind == "evict"]
    assert b_added.change == "added" and "needs approval" in b_added.why and "over the limit of 12%" in b_added.why
    assert result.totals.approvals == (0, 1)
    approval = _run(session, policy_approval_required_for="evict")
    assert [d.change for r in approval.incidents for d in r.differences] == ["act -> approval", "act -> approval"]
    assert approval.totals.approvals == (0, 2)


def test_the_same_input_gives_the_same_output(session) -> None:
    _history(session)
    first = backtest_report.as_text(_run(session, policy_evict_min_confidence=0.95))
    second = backtest_report.as_text(_run(session, policy_evict_min_confidence=0.95))
    assert first == second
    assert "policy_evict_min_confidence 0.8 -> 0.95" in first
    assert "evictions                         2          0  +0 added, -2 removed" in first


def test_the_backtest_writes_nothing_and_postgres_refuses_a_write_inside_it(session) -> None:
    _history(session)
    tables = list(session.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))
    before = {t: count(session, t) for t in tables}
    assert before["decisions"] == 3 and before["findings"] == 4 and before["incidents"] == 3
    _run(session, policy_evict_min_confidence=0.65)
    assert {t: count(session, t) for t in tables} == before
    with pytest.raises(DBAPIError, match="read-only transaction"), backtest.read_only(session):
        session.execute(text("DELETE FROM decisions"))
    assert count(session, "decisions") == 3  # and the session goes on after it


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"policy_evict_min_confidence": 1.5}, "policy_evict_min_confidence: Input should be less than or equal to 1"),
        ({"evict_threshold": 0.9}, "evict_threshold: not a policy setting; known: policy_mode"),
        ({"policy_mode": "yolo"}, "policy_mode: Input should be 'act', 'shadow' or 'approval'"),
        ({"policy_approval_required_for": "evict,reboot"}, "policy_approval_required_for.1: Input should be"),
    ],
)
def test_a_bad_policy_is_a_clear_error(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        overrides.candidate(_settings(), policy)
    assert message in raised.value.message


# ---- the command, against committed rows (it runs in its own process) ----


def _faultline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultline", *args], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )


def test_the_command_prints_explained_differences_writes_nothing_and_refuses_a_bad_file(committed, tmp_path) -> None:
    with sessionmaker(bind=committed)() as s:
        _history(s)
        s.commit()
    with committed.connect() as conn:
        tables = list(conn.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))

    def counts() -> dict[str, int]:
        with committed.connect() as conn:
            return {t: count(conn, t) for t in tables}

    before = counts()
    strict = tmp_path / "strict.toml"
    strict.write_text("policy_evict_min_confidence = 0.95\n")
    args = ["backtest", "--policy", str(strict), "--since", "2d", "--until", UNTIL.isoformat()]
    first = _faultline(*args, "--json", str(tmp_path / "a.json"))
    second = _faultline(*args, "--json", str(tmp_path / "b.json"))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert "evict a-1: removed. why: current policy: evict a-1 (pending)" in first.stdout
    assert "candidate: diagnose a-1 (pending) [confidence: 90% below the eviction threshold 95%]" in first.stdout
    totals = json.loads((tmp_path / "a.json").read_text())["totals"]
    assert totals["evictions"] == {"decided": 2, "candidate": 0} and totals["evictions_removed"] == 2

    job_only = _faultline(*args, "--job", "bt-c")
    assert job_only.returncode == 0 and "job bt-a" not in job_only.stdout and "job bt-c" in job_only.stdout

    bad = tmp_path / "bad.json"
    bad.write_text('{"policy_evict_min_confidence": 0.9, "policy_cooldown": 5}')
    refused = _faultline("backtest", "--policy", str(bad))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "faultline backtest: bad policy: policy_cooldown: not a policy setting" in refused.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("policy_evict_min_confidence = \n")
    assert "not valid TOML" in _faultline("backtest", "--policy", str(broken)).stderr
    window = _faultline("backtest", "--policy", str(strict), "--since", "soon")
    assert window.returncode == 2 and "not a duration: 'soon'" in window.stderr
    assert counts() == before


# ---- the what-if page ----


def test_the_what_if_page_is_prefilled_and_renders_results(session, ui) -> None:
    _history(session)
    blank = ui.get("/whatif")
    # Shares as percentages, as every other page shows them (issue 40): 80 for the 0.8 in effect.
    assert blank.status_code == 200 and 'name="policy_evict_min_confidence" value="80"' in blank.text
    assert '<a href="/whatif" class="active"' in blank.text
    params = {
        "run": "1",
        **{f.name: str(f.value) for f in policy_form.fields(overrides.current(_settings())) if f.kind != "checkboxes"},
        "policy_evict_min_confidence": "95",
        "since": "2d",
        "until": UNTIL.strftime("%Y-%m-%dT%H:%M"),
    }
    shown = ui.get("/whatif", params=params)
    assert shown.status_code == 200
    assert "+0 added, \N{MINUS SIGN}2 removed" in shown.text
    assert "confidence: 90% below the eviction threshold 95%" in shown.text
    assert 'name="policy_evict_min_confidence" value="95"' in shown.text
    assert "<code>policy_evict_min_confidence</code> 80% → 95%" in shown.text
    assert not re.search(r"\b0\.\d+\b", shown.text.split('class="card"', 2)[-1]), "no fraction in the results"
    decisions_before = count(session, "decisions")
    refused = ui.get("/whatif", params={**params, "policy_evict_min_confidence": "200"})
    assert refused.status_code == 422 and "200% is not a percentage between 0 and 100" in refused.text
    assert count(session, "decisions") == decisions_before


def test_the_what_if_page_needs_a_sign_in(client) -> None:
    response = client.get("/whatif", follow_redirects=False)
    assert response.status_code == 303 and "/login" in response.headers["location"]


def test_the_live_context_counts_prior_decisions_as_the_policy_expects(session) -> None:
    """build_context over stored rows, two hours after A's eviction (T0) and a minute after C's (T1 = T0 + 2 h):
    a-1 is out of its 30-minute cooldown and of bt-a's hour; c-3 (another job's) is in cooldown."""
    _history(session)
    a = session.scalar(select(Job).where(Job.external_id == "bt-a"))
    host = session.scalar(select(Incident).where(Incident.root_cause == "host"))
    (proposal,) = demarcate([(1, _finding("a-1", "host", 0.9, T0, "x"))])
    at = T1 + timedelta(seconds=60)
    ctx = _context(session, job=a, incident=host, proposal=proposal, now=at, settings=_settings())
    assert (ctx.job_nodes, ctx.evicted_last_hour, set(ctx.nodes_in_cooldown)) == (8, 0, {"c-3"})
    assert set(ctx.already_decided) == {("diagnose", "a-2")}


def test_a_stored_decision_the_current_policy_would_not_make_is_flagged(session) -> None:
    """A person's restart of job bt-c (an override): no replay makes it, and the line says so."""
    _history(session)
    c = session.scalar(select(Incident).join(Job, Job.id == Incident.job_id).where(Job.external_id == "bt-c"))
    session.add(
        Decision(
            incident_id=c.id,
            job_id=c.job_id,
            kind="restart",
            state="pending",
            confidence=1.0,
            reason="operator:alice restarts the job",
            evidence={"guard_rails": {}},
            created_at=T1 + timedelta(seconds=60),
        )
    )
    session.flush()
    (difference,) = _run(session).incidents[2].differences
    assert (difference.kind, difference.node, difference.change) == ("restart", None, "removed")
    assert "candidate: nothing [no finding asked for it]" in difference.why
    assert "the current policy's replay does not reproduce the stored decision" in difference.why


def test_network_flap_tolerance_is_replayed_from_the_findings_times(session) -> None:
    """Two port faults on n-1 a minute apart: the live path evicts on the second; three needed evicts nothing."""
    n = _job(session, "bt-n")
    t2 = T0 + timedelta(hours=4)
    _live_pass(session, n, [_finding("n-1", "network", 0.90, t2, "n1a")], t2)
    later = t2 + timedelta(seconds=60)
    _live_pass(session, n, [_finding("n-1", "network", 0.90, later, "n1b")], later)
    assert _summary(_run(session)) == [("network", ["evict n-1 +60"], ["evict n-1 +60"], [])]
    (incident,) = _run(session, policy_network_flap_count=3).incidents
    (removed,) = incident.differences
    assert (removed.kind, removed.node, removed.change) == ("evict", "n-1", "removed")
    assert "flap_tolerance: 2 network faults in 300 s" in removed.why
    assert "candidate: nothing [flap_tolerance: 2 network faults in 300 s, 3 needed]" in removed.why


def test_an_older_database_is_refused_with_the_command_to_run(monkeypatch, tmp_path, capsys) -> None:
    from faultline.cli import main
    from service import migrate

    monkeypatch.setattr(migrate, "current_and_head", lambda url: ("0009", "0010"))
    policy = tmp_path / "p.toml"
    policy.write_text("policy_evict_min_confidence = 0.95\n")
    assert main(["backtest", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "the database is at 0009, this code needs 0010: run `faultline migrate` first" in err
