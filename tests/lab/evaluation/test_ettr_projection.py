"""The projected ETTR at Llama 3's rate (lab/evaluation/ettr_projection.py) on fixed inputs: every figure by hand."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from lab.evaluation.campaign_scoring import DecisionRow, FaultOutcome, IncidentRow
from lab.evaluation.cli import main
from lab.evaluation.ettr_projection import (
    LLAMA3_TABLE5,
    Assumptions,
    fault_times,
    format_projection,
    mean_times,
    project,
    project_report,
)

WALL_S = 54 * 86400.0  # 4,665,600 s


def _fault(
    index: int, category: str, kind: str, node: str | None, t: float, dealt: float, **kw: object
) -> FaultOutcome:
    args: dict[str, object] = {
        "index": index,
        "job_id": "j",
        "category": category,
        "kind": kind,
        "node": node,
        "gpu": None,
        "expect_action": "evict",
        "eviction_optional": False,
        "localizable": True,
        "injected_s": t,
        "dealt_s": dealt,
        "how": "acted",
    }
    args.update(kw)
    return FaultOutcome(**args)  # type: ignore[arg-type]


FAULTS = [
    # Incident seen 4 s after the fault, eviction 6 s after it, the loop acted at 7 s: 4 + 2 + 1.
    _fault(0, "faulty_gpu", "gpu_lost", "n1", 100.0, 107.0),
    # Incident 10 s in, eviction 30 s in, acted 31 s in: 10 + 20 + 1.
    _fault(1, "faulty_gpu", "ecc_dbe", "n2", 1000.0, 1031.0),
    # Nothing decided: drained by hand 480 s in; its incident 60 s in: 60 + 420 + 0.
    _fault(2, "network_switch_cable", "ib_flap", "n3", 2000.0, 2480.0, how="by_hand"),
    # A user's bug, restarted by the user 120 s in; no incident of its job: detection is the whole span (120 + 0 + 0).
    _fault(
        3, "software_bug", "user_bug", None, 3000.0, 3120.0, expect_action="none", localizable=False, how="restarted"
    ),
    # A shared component's fault: not a row of Table 5, left out.
    _fault(4, "shared_cause", "leaf_switch_down", None, 4000.0, 4100.0, component_kind="leaf_switch", component="x"),
]
DECISIONS = [
    DecisionRow(1, "j", 106.0, "evict", "n1"),
    DecisionRow(2, "j", 1030.0, "evict", "n2"),
]
INCIDENTS = [
    IncidentRow(10, "j", 104.0, "infrastructure"),
    IncidentRow(11, "j", 1010.0, "infrastructure"),
    IncidentRow(12, "j", 1020.0, "infrastructure"),  # a later incident in the same window: the first one counts
    IncidentRow(13, "j", 2060.0, "infrastructure"),
    IncidentRow(14, "other", 3001.0, "user"),  # another job's: not this fault's detection
]


def test_fault_times_split_detection_decision_and_act() -> None:
    times = fault_times(FAULTS, DECISIONS, INCIDENTS)
    assert [(t.category, t.detection_s, t.decision_s, t.acted_s) for t in times] == [
        ("faulty_gpu", 4.0, 2.0, 1.0),
        ("faulty_gpu", 10.0, 20.0, 1.0),
        ("network_switch_cable", 60.0, 420.0, 0.0),
        ("software_bug", 120.0, 0.0, 0.0),
    ]
    m = mean_times(times)
    assert m["faulty_gpu"] == {"faults": 2, "detection_s": 7.0, "decision_s": 11.0, "acted_s": 1.0}
    # over the four: detection (4 + 10 + 60 + 120) / 4, decision (2 + 20 + 420) / 4, acted 2 / 4
    assert m["all"] == {"faults": 4, "detection_s": 48.5, "decision_s": 110.5, "acted_s": 0.5}


def test_table5_counts_add_up_to_419() -> None:
    assert sum(count for _, count, _ in LLAMA3_TABLE5) == 419
    assert dict((c, n) for c, n, _ in LLAMA3_TABLE5)["Faulty GPU"] == 148


def test_projection_arithmetic() -> None:
    # Every category 10 + 5 + 5 = 20 s measured; restart 100 s, spare wait 30 s, interval 600 s (300 s redone).
    measured = {"all": {"faults": 1, "detection_s": 10.0, "decision_s": 5.0, "acted_s": 5.0}}
    a = Assumptions(restart_s=100.0, spare_wait_s=30.0, checkpoint_interval_s=600.0, checkpoint_save_s=0.0)
    p = project(measured, a)
    per = 20.0 + 30.0 + 100.0 + 300.0  # 450 s
    assert p["lost_per_interruption_s"] == per
    assert p["lost_h"]["detection"] == round(419 * 10 / 3600, 2)
    assert p["lost_h"]["restart"] == round(419 * 100 / 3600, 2)
    assert p["lost_h"]["recomputation"] == round(419 * 300 / 3600, 2)
    assert p["ettr"] == round(1 - 419 * per / WALL_S, 4)  # 0.9596
    assert p["ettr"] == 0.9596
    assert p["hours_between_interruptions"] == round(54 * 24 / 419, 2)
    assert all(r["times_from"] == "all" for r in p["rows"])
    assert p["measured_parts"] == ["detection", "decision", "acted"]
    assert "restart" in p["assumed_parts"] and "recomputation" in p["assumed_parts"]


def test_category_times_used_where_measured_and_saves_cost_what_is_left() -> None:
    measured = {
        "all": {"faults": 3, "detection_s": 0.0, "decision_s": 0.0, "acted_s": 0.0},
        "faulty_gpu": {"faults": 2, "detection_s": 100.0, "decision_s": 0.0, "acted_s": 0.0},
    }
    a = Assumptions(restart_s=0.0, checkpoint_interval_s=0.0, checkpoint_save_s=0.0)
    p = project(measured, a)
    # Only the 148 faulty-GPU interruptions cost anything: 100 s each.
    assert p["lost_h"]["detection"] == round(148 * 100 / 3600, 2)
    assert p["ettr"] == round(1 - 148 * 100 / WALL_S, 4)
    row = next(r for r in p["rows"] if r["component"] == "Faulty GPU")
    assert (row["times_from"], row["campaign_faults"], row["lost_per_interruption_s"]) == ("faulty_gpu", 2, 100.0)
    # A 10 s pause every 1000 s on the time the interruptions left: 1% of (wall - 148 * (100 + 500)).
    p = project(measured, Assumptions(restart_s=0.0, checkpoint_interval_s=1000.0, checkpoint_save_s=10.0))
    stopped = 148 * (100 + 500) + (419 - 148) * 500
    assert p["lost_share"]["checkpoint_saves"] == round((WALL_S - stopped) * 0.01 / WALL_S, 5)
    assert p["ettr"] == round(1 - (stopped + (WALL_S - stopped) * 0.01) / WALL_S, 4)


def test_a_different_rate_keeps_the_mix() -> None:
    measured = {"all": {"faults": 1, "detection_s": 0.0, "decision_s": 0.0, "acted_s": 0.0}}
    p = project(measured, Assumptions(interruptions=838, restart_s=100.0, checkpoint_interval_s=0.0))
    assert p["lost_h"]["restart"] == round(838 * 100 / 3600, 2)


def test_from_a_saved_campaign_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = {
        "faults": [asdict(f) for f in FAULTS],
        "decisions": [asdict(d) for d in DECISIONS],
        "incidents": [asdict(i) for i in INCIDENTS],
    }
    saved = json.loads(json.dumps(report))  # tuples become lists, as in the file
    p = project_report(saved, Assumptions(restart_s=60.0))
    assert p is not None and p["measured"]["faulty_gpu"]["decision_s"] == 11.0
    text = format_projection(p)
    assert "restart (assumed 60 s)" in text and "Table 5" in text
    assert project_report({"faults": [], "decisions": [], "incidents": []}) is None

    path = tmp_path / "campaign.json"
    path.write_text(json.dumps(saved))
    out = tmp_path / "projection.json"
    assert main(["--project-ettr", str(path), "--restart-s", "60", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["ettr"] == p["ettr"]
    assert "projected ETTR of a 16,384-GPU job" in capsys.readouterr().out
    path.write_text("{}")
    assert main(["--project-ettr", str(path)]) == 2  # not a campaign's JSON: a setup error, not a traceback
