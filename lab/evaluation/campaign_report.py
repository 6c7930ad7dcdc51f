"""The campaign's report: built at the end of a run from what the harness recorded (the incidents' final blame read
from the service), scored (lab/evaluation/campaign_scoring.py), printed, written."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select

from lab.evaluation import campaign_scoring as scoring
from lab.evaluation.campaign_jobs import CampaignJob
from lab.evaluation.campaign_returns import final_states
from lab.evaluation.ettr_projection import format_projection, project_report
from lab.evaluation.report_files import hms
from service.db import session_scope
from service.models import Incident


def campaign_report(
    jobs: Sequence[CampaignJob],
    *,
    outcomes: Sequence[scoring.FaultOutcome],
    stale: Mapping[int, Sequence[int]],
    decision_rows: Mapping[int, scoring.DecisionRow],
    incident_rows: Mapping[int, scoring.IncidentRow],
    shared_rows: Mapping[int, scoring.SharedIncidentRow],
    loop_acts: list[dict[str, Any]],
    spares: int,
    seed: int,
    start: datetime,
    covered_s: float,
    wall_s: float,
) -> dict[str, Any]:
    """The campaign's plain records (its jobs, their progress, the faults with their stale incidents, the decisions,
    the incidents, the loop's acts and the checks), unscored."""
    # Blame may be settled after an incident opened, and it may have resolved since: read them at the end.
    with session_scope() as session:
        final = {
            row.id: row
            for row in session.execute(
                select(Incident.id, Incident.blame, Incident.root_cause, Incident.anchor, Incident.resolution).where(
                    Incident.id.in_(incident_rows)
                )
            )
        }
        # Where each machine ended (still `returning`? a gate waiting?) and the work placed before a gate.
        ends = [final_states(session, j.run.cluster, job_id=j.run.job_id, start=start) for j in jobs]
    incidents = [
        replace(r, blame=f.blame, root_cause=f.root_cause, anchor=f.anchor, resolution=f.resolution)
        if (f := final.get(r.id)) is not None
        else r
        for r in incident_rows.values()
    ]
    faults = [replace(o, stale_incidents=tuple(stale.get(o.index, ()))) for o in outcomes]
    progress = []
    for job in jobs:
        c = job.run.cluster
        steps = sorted(d for _, _, d in c.step_history)
        step_s = steps[len(steps) // 2] if steps else job.step_s  # the job's typical step, noise included
        progress.append(
            scoring.JobProgress(job.run.job_id, covered_s, round((c.job.step - job.first_step) * step_s, 1))
        )
    return {
        "simulated_s": covered_s,
        "wall_s": round(wall_s, 1),
        "seed": seed,
        "started_at": start.isoformat(),
        "jobs": [
            {
                "job_id": j.run.job_id,
                "nodes": j.run.spec.nodes,
                "gpus_per_node": j.run.spec.gpus_per_node,
                "tp": j.run.spec.tp,
                "pp": j.run.spec.pp,
                "spares": spares,
                "restarts": j.run.cluster.generation,
                "steps_trained": j.run.cluster.job.step - j.first_step,
                "loop_events": [e.to_json() for e in j.run.cluster.loop_events],
                "unfinished_fault": j.active.index if j.active is not None else None,
                # Where and when: a decision on it answers a fault the run ended in, no false accusation.
                "unfinished_at": ({"node": j.active.node, "injected_s": j.active.t} if j.active is not None else None),
            }
            for j in jobs
        ],
        "progress": [asdict(p) for p in progress],
        "faults": [asdict(o) for o in faults],
        "decisions": [asdict(d) for d in decision_rows.values()],
        "incidents": [asdict(i) for i in incidents],
        "shared_incidents": [asdict(s) for s in shared_rows.values()],
        "loop_acts": loop_acts,
        "checks": [asdict(r) for j in jobs if j.desk is not None for r in j.desk.records],
        "returns": [r for j in jobs for r in j.returns.returns],
        "returns_refused": [r for j in jobs for r in j.returns.refused],
        "gates": [asdict(g) for j in jobs for g in j.returns.records],
        "node_ends": [asdict(e) for f in ends for e in f["ends"]],
        "node_notes": [asdict(n) for f in ends for n in f["notes"]],
    }


def scored(report: dict[str, Any]) -> dict[str, Any]:
    """The report with its `categories`, `totals`, `missed` and `targets` (from its plain records)."""
    faults = sorted(
        (
            scoring.FaultOutcome(
                **{**f, "stale_incidents": tuple(f["stale_incidents"]), "members": tuple(f.get("members", ()))}
            )
            for f in report["faults"]
        ),
        key=lambda f: f.index,
    )
    unfinished = {j["job_id"]: j["unfinished_at"] for j in report["jobs"] if j.get("unfinished_at")}
    notes = [scoring.NodeNote(**n) for n in report.get("node_notes", [])]
    result = scoring.score(
        faults,
        [scoring.DecisionRow(**d) for d in report["decisions"] if not _answers(d, unfinished.get(d["job_id"]))],
        [scoring.IncidentRow(**i) for i in report["incidents"]],
        [scoring.JobProgress(**p) for p in report["progress"]],
        [scoring.CheckRow(**c) for c in report.get("checks", [])],
        notes,
        [
            scoring.SharedIncidentRow(**{**s, "members": tuple(s["members"])})
            for s in report.get("shared_incidents", [])
        ],
    )
    result["totals"].update(
        scoring.returns_totals(
            len(report.get("returns", [])),
            len(report.get("returns_refused", [])),
            [scoring.GateRow(**{**g, "failed_checks": tuple(g["failed_checks"])}) for g in report.get("gates", [])],
            notes,
            [scoring.NodeEnd(**e) for e in report.get("node_ends", [])],
        )
    )
    # What the measured times would cost a 16k-GPU job at a real fault rate (the campaign's own ETTR cannot say).
    result["ettr_projection"] = project_report(report)
    return {**report, **result}


def _answers(decision: dict[str, Any], unfinished: dict[str, Any] | None) -> bool:
    """Whether a decision is about the fault its job was going through when the run was stopped."""
    return (
        unfinished is not None
        and decision["node"] == unfinished["node"]
        and decision["t_s"] >= unfinished["injected_s"] - scoring.CLOCK_SLACK_S
    )


def format_report(report: dict[str, Any]) -> str:
    jobs = ", ".join(
        f"{j['job_id']} ({j['nodes']}x{j['gpus_per_node']} + {j['spares']} spares)" for j in report["jobs"]
    )
    head = (
        f"campaign: {report['totals']['faults']} faults from the Llama 3 405B mix, {hms(report['simulated_s'])} of "
        f"simulated time (h:mm:ss) in {report['wall_s'] / 60:.1f} min of wall time (seed {report['seed']}); {jobs}"
    )
    acts = Counter(f"{a['kind']} {a['ack']}" for a in report["loop_acts"])
    loop = "the loop acted: " + (", ".join(f"{k} {v}" for k, v in sorted(acts.items())) or "never")
    lines = [head, loop, "", scoring.format_table(report)]
    if report.get("ettr_projection"):
        lines += ["", format_projection(report["ettr_projection"])]
    return "\n".join(lines)
