"""The soak's report: its targets (no eviction; at most MAX_DIAGNOSE_PER_JOB_DAY diagnoses per job and simulated
day), its table in plain text, its JSON file."""

from __future__ import annotations

from collections import Counter
from typing import Any

from lab.evaluation.report_files import hms
from lab.evaluation.soak_config import DAY_S

# Targets (issue 17): no eviction at all, at most one diagnose per job per simulated day.
MAX_DIAGNOSE_PER_JOB_DAY = 1.0


def targets(report: dict[str, Any]) -> list[dict[str, str]]:
    """Zero evictions; at most MAX_DIAGNOSE_PER_JOB_DAY diagnoses per job per simulated day."""
    jobs = report["jobs"]
    days = report["simulated_s"] / DAY_S
    evictions = sum(j["evictions"] for j in jobs)
    diagnoses = sum(j["diagnoses"] for j in jobs)
    job_days = days * len(jobs)
    rate = diagnoses / job_days if job_days else 0.0
    worst = max((j["diagnoses"] / days for j in jobs), default=0.0) if days else 0.0
    return [
        {"name": "no eviction", "status": "PASS" if evictions == 0 else "FAIL", "detail": f"{evictions} evictions"},
        {
            "name": f"<= {MAX_DIAGNOSE_PER_JOB_DAY:g} diagnose per job-day",
            "status": "PASS" if worst <= MAX_DIAGNOSE_PER_JOB_DAY else "FAIL",
            "detail": f"{diagnoses} over {job_days:.2f} job-days ({rate:.2f} per job-day; worst job {worst:.2f})",
        },
    ]


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"soak: {hms(report['simulated_s'])} of simulated time (h:mm:ss) in {report['wall_s'] / 60:.1f} min of "
        f"wall time (seed {report['seed']}, from {report['started_at']})"
        + (" -- interrupted: the targets cover this time only" if report.get("interrupted") else ""),
        "",
        f"{'job':<18} {'shape':<16} {'steps':>7} {'passes':>7} {'ms/pass':>8} {'findings':>8} {'incidents':>9} "
        f"{'diagnose':>8} {'evict':>5} {'stacks':>6}  noise",
    ]
    for j in report["jobs"]:
        shape = f"{j['nodes']}x{j['gpus'] // j['nodes']} tp{j['tp']} pp{j['pp']}"
        noise = ", ".join(f"{k} {v}" for k, v in j["noise"].items())
        lines.append(
            f"{j['job_id']:<18} {shape:<16} {j['steps_trained']:>7} {j['passes']:>7} {j['mean_pass_ms']:>8} "
            f"{j['findings']:>8} {j['incidents']:>9} {j['diagnoses']:>8} {j['evictions']:>5} {j['stack_requests']:>6}  "
            f"{noise}"
        )
    by_detector = Counter((f["detector"], f["node"] is not None) for f in report["findings"])
    if by_detector:
        lines += ["", "findings by detector (machine-naming or job-level):"]
        for (detector, named), n in sorted(by_detector.items()):
            confs = [
                f["confidence"]
                for f in report["findings"]
                if f["detector"] == detector and (f["node"] is not None) == named
            ]
            scope = "machine" if named else "job"
            lines.append(f"  {detector:<28} {scope:<8} {n:>5}  confidence {min(confs):.2f}-{max(confs):.2f}")
    if report["decisions"]:
        lines += ["", "decisions:"]
        for d in report["decisions"]:
            t = "?" if d["t_s"] is None else hms(d["t_s"])
            lines.append(f"  t={t} {d['job_id']} {d['kind']} {d['node'] or '-'} ({d['confidence']:.2f}): {d['reason']}")
    lines += ["", "targets:"]
    lines += [f"  {t['status']:<4}  {t['name']}: {t['detail']}" for t in report["targets"]]
    return "\n".join(lines)
