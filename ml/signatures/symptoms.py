"""Symptom rules: what victims print (watchdog and collective timeouts, a stuck watchdog, torchrun and elastic
errors) and the pointers some of it carries (a desync report's lagging ranks, the ranks a flight-recorder analysis
found missing from a collective, the root rank whose NCCL id never reached the store, a failed barrier's rank, a
lost heartbeat)."""

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
    return findings


def _pointer_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """Symptoms that name the ranks others waited for: a desync report's lagging ranks, a failed barrier."""
    pointed: dict[str, list[_Occ]] = defaultdict(list)
    pointed_ranks: dict[str, set[int]] = defaultdict(set)
    unresolved: list[_Occ] = []
    for o in occs:
        ranks: list[int] = []
        if o.kind == "desync_report":
            ranks = [r for r in o.fields.get("lagging_ranks") or [] if isinstance(r, int)]
        elif o.kind == "flight_recorder":
            ranks = [r for r in o.fields.get("missing_ranks") or [] if isinstance(r, int)]
        elif (
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
        else:
            continue
        nodes = {n for r in ranks if (n := job.node_of_rank(r))}
        if len(nodes) == 1:
            node = next(iter(nodes))
            pointed[node].append(o)
            pointed_ranks[node].update(ranks)
        else:
            unresolved.append(o)
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
    reports = [o for o in unresolved if o.kind == "flight_recorder"]
    if reports:
        missing = sorted({r for o in reports for r in o.fields.get("missing_ranks") or [] if isinstance(r, int)})
        collectives = sorted({c for o in reports if isinstance(c := o.fields.get("collective"), int)})
        ops = sorted({str(o.fields["op"]) for o in reports if o.fields.get("op")})
        findings.append(
            _finding(
                reports,
                key="flight_recorder",
                category="job_failure",
                confidence=0.35,
                summary="flight recorder: "
                + (f"ranks {missing[:8]} never joined" if missing else "ranks missing from")
                + (f" {', '.join(ops)}" if ops else " a collective")
                + (f" #{collectives[0]}" if len(collectives) == 1 else ""),
                node=None,
                job=job,
                role="symptom",
                sig_text="flight recorder " + " ".join(ops),
                lagging_ranks=missing[:MAX_LIST] or None,
                collectives=collectives[:MAX_LIST] or None,
                ops=ops or None,
            )
        )
    desyncs = [o for o in unresolved if o.kind == "desync_report"]
    if desyncs:
        lagging = sorted({r for o in desyncs for r in o.fields.get("lagging_ranks") or [] if isinstance(r, int)})
        findings.append(
            _finding(
                desyncs,
                key="desync_report",
                category="job_failure",
                confidence=0.3,
                summary="NCCL desync report" + (f": ranks {lagging[:8]} did not join" if lagging else ""),
                node=None,
                job=job,
                role="symptom",
                sig_text="desync",
                lagging_ranks=lagging[:MAX_LIST] or None,
            )
        )
    return findings
