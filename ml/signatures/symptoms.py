"""Symptom rules: what victims print (watchdog and collective timeouts, a stuck watchdog, torchrun and elastic
errors, NCCL RAS's warnings) and the pointers some of it carries (the root rank whose NCCL id never reached the store,
a failed barrier's rank, a lost heartbeat, a process RAS found dead).

Ranks that did not join a collective (a desync report's lagging ranks, a flight-recorder analysis's missing ranks)
point at no machine: most often they took another path through the code, and the machine holding them is innocent
(collectives.py reads them)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from ml.findings import Finding
from ml.signatures.common import MAX_LIST, _finding, _Job, _Occ, _rank_note

_SYMPTOM_NAMES = {
    "watchdog_timeout": "NCCL watchdog timeouts",
    "watchdog_exception": "NCCL watchdog exceptions",
    "watchdog_stuck": "NCCL watchdog stuck in a CUDA/NCCL call (heartbeat monitor)",
    "collective_timeout": "collective timeouts",
    "child_failed": "torchrun: worker processes failed",
    "elastic_error": "launcher errors (torchrun elastic agent, DeepSpeed launcher)",
    "cpp_exception": "C++ exceptions",
}


# torchrun waits 30 s (its default) for its workers to stop on SIGTERM before it kills them.
ORDERED_STOP_S = 60.0


def _without_ordered_stops(occs: list[_Occ]) -> list[_Occ]:
    """The occurrences less the launcher lines of an ordered stop: a launcher told to stop (`Received SIGTERM death
    signal`: the scheduler's stop, a preemption, the eviction of a machine) and the closing signals it then sent its
    workers on that node. Each line alone reads like a failure; together they say the job was stopped from
    outside, which is no fault of the job's (a host OOM or a fault that made the scheduler stop the job has
    evidence of its own)."""
    deaths: dict[str, list[datetime]] = defaultdict(list)
    for o in occs:
        if o.kind == "elastic_error" and o.fields.get("category") == "death_signal":
            deaths[o.node].append(o.ts)
    if not deaths:
        return occs

    def ordered(o: _Occ) -> bool:
        if o.kind != "elastic_error" or o.node not in deaths:
            return False
        category = o.fields.get("category")
        return category == "death_signal" or (
            category == "closing_signal"
            and any(0 <= (o.ts - d).total_seconds() <= ORDERED_STOP_S for d in deaths[o.node])
        )

    return [o for o in occs if not ordered(o)]


def _symptom_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    findings: list[Finding] = []
    occs = _without_ordered_stops(occs)
    for kind, name in _SYMPTOM_NAMES.items():
        group = [o for o in occs if o.kind == kind]
        if not group:
            continue
        extra: dict[str, Any] = {}
        if kind == "watchdog_timeout":
            seqs = sorted({s for o in group if isinstance(s := o.fields.get("seq"), int)})
            extra = {"seqs": seqs[:MAX_LIST] or None, "ops": sorted({str(o.fields.get("op")) for o in group})}
        elif kind == "child_failed":
            failed = sorted({r for o in group for r in (o.fields.get("failures") or []) if isinstance(r, int)})
            roots = sorted({r for o in group if isinstance(r := o.fields.get("root_rank"), int)})
            signals = sorted({str(o.fields["signal"]) for o in group if o.fields.get("signal")})
            extra = {"failed_ranks": failed or None, "root_ranks": roots or None, "exit_signals": signals or None}
        findings.append(
            _finding(
                group,
                key=f"symptom:{kind}",
                category="job_failure",
                confidence=0.3,
                summary=f"{name}{_rank_note(group)}",
                node=None,
                job=job,
                role="symptom",
                sig_text=kind,
                **extra,
            )
        )
    findings += _pointer_findings(occs, job)
    findings += _ras_findings(occs, job)
    return findings


def _pointer_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """Symptoms that name the rank or machine others waited for: the NCCL id's root rank, a failed barrier's rank, a
    lost heartbeat, a process RAS found dead."""
    pointed: dict[str, list[_Occ]] = defaultdict(list)
    pointed_ranks: dict[str, set[int]] = defaultdict(set)
    for o in occs:
        ranks: list[int] = []
        if (
            o.kind == "nccl_error"
            and o.fields.get("category") == "init_store"
            and isinstance(root := o.fields.get("root_rank"), int)
        ):
            ranks = [root]  # NCCL init waited in the store for the id this rank publishes
        elif o.kind == "collective_timeout" and isinstance(o.fields.get("failed_rank"), int):
            ranks = [o.fields["failed_rank"]]
        elif o.kind == "elastic_error" and o.fields.get("category") in ("heartbeat", "rendezvous_shutdown"):
            node = job.resolve(str(o.fields.get("node") or ""))
            if node:
                pointed[node].append(o)
            continue
        elif o.kind == "nccl_ras":
            names = {str(name) for issue in _ras_failures(o) for name in issue.get("nodes") or ()}
            for node in {n for name in names if (n := job.resolve(name))}:
                pointed[node].append(o)
            continue
        else:
            continue
        nodes = {n for r in ranks if (n := job.node_of_rank(r))}
        if len(nodes) == 1:
            node = next(iter(nodes))
            pointed[node].append(o)
            pointed_ranks[node].update(ranks)
    findings = [
        _finding(
            group,
            key=f"pointer:{node}",
            category="job_failure",
            confidence=0.45,
            summary=f"peers waited for {node}"
            + (f" (ranks {sorted(pointed_ranks[node])})" if pointed_ranks[node] else ""),
            node=node,
            job=job,
            role="symptom",
            action="diagnose",
            sig_text=f"pointer {node}",
            lagging_ranks=sorted(pointed_ranks[node]) or None,
        )
        for node, group in sorted(pointed.items())
    ]
    return findings


# RAS entries that say a rank or a process failed (the others, MISMATCH and TIMEOUT, are warnings).
_RAS_FAILED = frozenset({"INCOMPLETE", "ERROR", "DEAD"})


def _ras_failures(o: _Occ) -> list[dict[str, Any]]:
    issues = o.fields.get("issues")
    return [i for i in issues or () if isinstance(i, dict) and i.get("kind") in _RAS_FAILED]


def _ras_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """NCCL RAS's report of a communicator in trouble: which collective's counts differ and how far the ranks got, or
    which ranks and processes stopped answering. A symptom: ranks apart in their counts are stragglers or ranks that
    took another path (RAS itself calls a mismatch a warning); a dead process is pointed at above."""
    reports = [o for o in occs if o.kind == "nccl_ras" and (o.fields.get("errors") or o.fields.get("issues"))]
    if not reports:
        return []
    issues = [i for o in reports for i in o.fields.get("issues") or () if isinstance(i, dict)]
    words = []
    for issue in issues[:3]:
        counts = ", ".join(
            f"{c.get('ranks')} rank{'s' * (c.get('ranks') != 1)} at {c.get('operation')}"
            for c in issue.get("op_counts") or ()
            if isinstance(c, dict)
        )
        ranks = [r for r in issue.get("ranks") or () if isinstance(r, int)]
        words.append(
            f"{issue.get('comm') or ''} {issue.get('kind')}".strip()
            + (f": {issue['op']} operation counts differ" if issue.get("op") else "")
            + (f" ({counts})" if counts else "")
            + (f", ranks {ranks[:8]} apart" if ranks else "")
        )
    errors = sorted({str(e) for o in reports for e in o.fields.get("errors") or ()})
    ras_ranks = sorted({r for i in issues for r in i.get("ranks") or () if isinstance(r, int)})
    summary = "NCCL RAS: " + ("; ".join(words) if words else ", ".join(errors))
    return [
        _finding(
            reports,
            key="nccl_ras",
            category="job_failure",
            confidence=0.35 if any(_ras_failures(o) for o in reports) else 0.3,
            summary=summary,
            node=None,
            job=job,
            role="symptom",
            sig_text="nccl ras " + " ".join(errors),
            ras_errors=errors or None,
            ras_ranks=ras_ranks[:MAX_LIST] or None,
        )
    ]
