"""A backtest as text (the CLI) and as plain data (--json, the what-if page): stable order, no clock but the window."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from service.decisions.backtest import Backtest, IncidentResult, Verdict


def _when(value: datetime) -> str:
    return value.isoformat()


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} s"


def _verdicts(verdicts: list[Verdict], opened_at: datetime) -> str:
    if not verdicts:
        return "nothing"
    return ", ".join(f"{v.describe()} at +{(v.at - opened_at).total_seconds():.0f} s" for v in verdicts)


def _setting(value: Any) -> str:
    return ",".join(value) or "[]" if isinstance(value, list) else str(value)


def as_text(result: Backtest) -> str:
    lines = [
        f"backtest of incidents opened from {_when(result.since)} to {_when(result.until)}"
        + (f" in jobs {', '.join(result.jobs)}" if result.jobs else ""),
        "candidate policy: "
        + (
            ", ".join(f"{name} {_setting(a)} -> {_setting(b)}" for name, (a, b) in result.changed_settings.items())
            or "the same settings as the current policy"
        ),
        "",
    ]
    for r in result.incidents:
        lines += _incident(r)
    t = result.totals
    rows = [
        ("evictions", *t.evictions, f"+{t.evictions_added} added, -{t.evictions_removed} removed"),
        ("approvals needed", *t.approvals, ""),
        ("diagnoses", *t.diagnoses, ""),
        ("restarts and rollbacks", *t.job_actions, ""),
        ("time to decision, median", *map(_seconds, t.ttd_median_s), ""),
        ("time to decision, p95", *map(_seconds, t.ttd_p95_s), ""),
    ]
    lines += [
        f"totals: {t.incidents} incidents, {t.changed_incidents} decided differently",
        f"  {'':<26}{'decided':>9}{'candidate':>11}",
        *(f"  {name:<26}{a!s:>9}{b!s:>11}  {note}".rstrip() for name, a, b, note in rows),
    ]
    return "\n".join(lines) + "\n"


def _incident(r: IncidentResult) -> list[str]:
    steps = f"{r.steps} step{'s' if r.steps != 1 else ''}"
    head = f"incident {r.incident_id} · job {r.job} · {r.root_cause} · opened {_when(r.opened_at)} · {steps}"
    lines = [
        head,
        f"  decided:   {_verdicts(r.decided, r.opened_at)}",
        f"  candidate: {_verdicts(r.candidate, r.opened_at)}",
    ]
    if not r.differences:
        lines.append("  same outcome")
    # One line per node (or the job): its changes, then the why they share.
    by_node: dict[str | None, list[str]] = {}
    whys: dict[str | None, str] = {}
    for d in r.differences:
        by_node.setdefault(d.node, []).append(f"{d.kind} {d.node}: {d.change}" if d.node else f"{d.kind}: {d.change}")
        whys[d.node] = d.why
    lines += [f"  {'; '.join(changes)}. why: {whys[node]}" for node, changes in by_node.items()]
    return [*lines, ""]


def _verdict(v: Verdict, opened_at: datetime) -> dict[str, Any]:
    return {
        "kind": v.kind,
        "node": v.node,
        "state": v.state,
        "needs_approval": v.approval,
        "after_s": (v.at - opened_at).total_seconds(),
        "guard_rails": dict(sorted(v.rails.items())),
    }


def as_dict(result: Backtest) -> dict[str, Any]:
    t = result.totals
    return {
        "since": _when(result.since),
        "until": _when(result.until),
        "jobs": result.jobs,
        "changed_settings": {name: {"current": a, "candidate": b} for name, (a, b) in result.changed_settings.items()},
        "incidents": [
            {
                "incident_id": r.incident_id,
                "job": r.job,
                "root_cause": r.root_cause,
                "opened_at": _when(r.opened_at),
                "steps": r.steps,
                "decided": [_verdict(v, r.opened_at) for v in r.decided],
                "candidate": [_verdict(v, r.opened_at) for v in r.candidate],
                "differences": [
                    {"kind": d.kind, "node": d.node, "change": d.change, "why": d.why} for d in r.differences
                ],
            }
            for r in result.incidents
        ],
        "totals": {
            "incidents": t.incidents,
            "changed_incidents": t.changed_incidents,
            "evictions": {"decided": t.evictions[0], "candidate": t.evictions[1]},
            "evictions_added": t.evictions_added,
            "evictions_removed": t.evictions_removed,
            "approvals_needed": {"decided": t.approvals[0], "candidate": t.approvals[1]},
            "diagnoses": {"decided": t.diagnoses[0], "candidate": t.diagnoses[1]},
            "restarts_and_rollbacks": {"decided": t.job_actions[0], "candidate": t.job_actions[1]},
            "time_to_decision_median_s": {"decided": t.ttd_median_s[0], "candidate": t.ttd_median_s[1]},
            "time_to_decision_p95_s": {"decided": t.ttd_p95_s[0], "candidate": t.ttd_p95_s[1]},
        },
    }
