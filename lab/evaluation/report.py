"""The eval's report: one row per scenario run, then the summary and the targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from lab.evaluation.records import ScenarioScore
from lab.evaluation.scoring import FAIL, Summary

COLUMNS = ("scenario", "seed", "detected", "evicted", "expected", "correct", "blame (got/want)", "decision", "note")


def _nodes(score: ScenarioScore, nodes: Sequence[str]) -> str:
    prefix = score.node_prefix + "-" if score.node_prefix else ""
    return ",".join(n.removeprefix(prefix) for n in nodes) or "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _note(score: ScenarioScore) -> str:
    notes = []
    if score.error:
        notes.append(f"error: {score.error}")
    if score.tolerated:
        notes.append(f"evicted {_nodes(score, score.tolerated)} (acceptable)")
    if score.false_accusations:
        notes.append(f"diagnosed healthy {_nodes(score, score.false_accusations)}")  # or a domain's tray evicted alone
    if score.domain_cordoned:
        incidents = f"{score.shared_incidents} shared incident{'s' if score.shared_incidents != 1 else ''}"
        notes.append(f"cordoned {_nodes(score, score.domain_cordoned)} ({incidents})")
    if score.early_decisions:
        notes.append(f"{score.early_decisions} decisions before the fault")
    if score.first_decision and score.time_to_decision_s is not None:
        first = score.first_decision
        notes.append(f"first: {first['kind']} {_nodes(score, [first['node']]) if first['node'] else 'job'}")
    notes += score.notes
    return "; ".join(notes)


def row(score: ScenarioScore) -> tuple[str, ...]:
    blame = f"{score.blame_decided or '-'}/{score.blame_expected}"
    if score.blame_ok is False:
        blame += " !"
    return (
        score.scenario,
        str(score.seed if score.seed is not None else "-"),
        "yes" if score.detected else "no",
        _nodes(score, score.evicted),
        _nodes(score, score.expected),
        "yes" if score.correct else "NO",
        blame,
        _seconds(score.time_to_decision_s),
        _note(score),
    )


def format_table(scores: Sequence[ScenarioScore]) -> str:
    """A plain-text table; the last column (notes) is not padded."""
    rows = [COLUMNS, *(row(s) for s in scores)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join([*(cell.ljust(w) for cell, w in zip(r, widths, strict=False)), r[-1]]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in [*widths, len(COLUMNS[-1])]))
    return "\n".join(lines)


def format_summary(summary: Summary) -> str:
    s = summary
    lines = [
        f"runs {s.scenarios}: detected {s.detected}, correct {s.correct}, errors {s.errors}",
        f"machines: TP {s.tp}, FP {s.fp}, FN {s.fn}; precision {_ratio(s.precision)}, recall {_ratio(s.recall)}, "
        f"F1 {_ratio(s.f1)}",
        f"time to decision: median {_seconds(s.median_s)}, p95 {_seconds(s.p95_s)}",
        f"false accusations (healthy machines sent to diagnostics, or a failed NVLink domain's healthy trays taken "
        f"out alone): {s.false_accusations} over {s.faults} faults",
        f"evictions on healthy runs: {s.healthy_evictions} over {s.healthy_runs} runs; "
        f"on user-code faults: {s.user_code_evictions} over {s.user_code_runs} runs",
        "",
        "targets:",
    ]
    width = max((len(t.name) for t in s.targets), default=0)
    lines += [f"  {t.status:<4}  {t.name:<{width}}  {t.detail}" for t in s.targets]
    failed = sum(t.status == FAIL for t in s.targets)
    lines += ["", "all targets met" if s.passed else f"{failed} target(s) not met"]
    return "\n".join(lines)


def concurrent_faults(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runs (`scenario/sSEED`) whose fault came while another job's fault was still undecided: faults in
    two jobs at once on one service (`--parallel 2`). A fault is open from its first injection to the run's
    first decision, or to the run's end when nothing was decided. Takes RunResult.to_json() dicts, so it also
    reads a saved eval.json."""
    spans: list[tuple[str, datetime, datetime]] = []
    for run in runs:
        faults = run["ground_truth"].get("faults") or []
        if not faults or not run.get("ended_at"):
            continue
        start = min(datetime.fromisoformat(f["injected_at"]) for f in faults)
        took = run["score"].get("time_to_decision_s")
        end = start + timedelta(seconds=took) if took is not None else datetime.fromisoformat(run["ended_at"])
        spans.append((f"{run['score']['scenario']}/s{run['score']['seed']}", start, end))
    return [
        name
        for i, (name, start, end) in enumerate(spans)
        if any(j != i and start < e and s < end for j, (_, s, e) in enumerate(spans))
    ]
