"""Collectives the ranks disagreed on, and NCCL told it was used wrongly: the application's, never a machine's.

- A mismatch a check caught (PyTorch's fingerprint check, NCCL's check of the calls, its transports finding the two
  sides of a transfer sized differently, a flight-recorder analysis naming a culprit rank whose collective differs
  in type, size or dtype): the ranks called different collectives, or the same one with different tensors. User
  code, whatever else went wrong in the job.
- Ranks that did not join a collective the others waited in (a flight-recorder analysis's missing ranks, a desync
  report's lagging ranks) or entered it in another state: ranks that took different paths through the code, most
  often; a rank stuck on a broken machine looks the same, so when the job has an infrastructure cause on the machine
  of those ranks (or anywhere, when their machines are unknown) the report is that fault's symptom instead. Either
  way it names the collective and the ranks, and never makes their machine a suspect: the innocent peer of a rank
  that ran ahead is the one such a pointer would accuse.
- NCCL's invalid usage (ncclInvalidUsage: two ranks on one GPU, a collective called wrongly): the job's launch
  configuration or code.

Runs after the other rules, on their findings (app_faults): whether an infrastructure cause is there decides what a
report of ranks that did not join is. A cause here explains the victims' watchdog timeouts and NCCL errors of the
same job, which stay symptoms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ml.findings import Finding
from ml.signatures.common import MAX_LIST, _finding, _Job, _Occ, _rank_note

# The analyzer's MatchState values that say the ranks' calls differ (COLLECTIVE_STATE_MISMATCH only says one rank's
# entry got further than another's: weak, dumps are not taken at one instant).
_CALL_MISMATCHES = frozenset({"COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH"})
_INVALID_USAGE = "ncclInvalidUsage"


def collective_findings(findings: Sequence[Finding], occs: Sequence[_Occ], job: _Job) -> list[Finding]:
    """The findings these rules add to the others' `findings`."""
    explicit = [o for o in occs if o.kind == "collective_mismatch" or _culprit_mismatch(o)]
    misuse = [o for o in occs if _invalid_usage(o)]
    explicit_set = set(explicit)
    diverged = [o for o in occs if o.kind in ("flight_recorder", "desync_report") and o not in explicit_set]
    out: list[Finding] = []
    if explicit:
        # NCCL's "invalid usage" is how it fails a mismatch its transport caught, and the ranks that did not join are
        # the mismatch seen from the other side: one claim. Two ranks on one GPU stay a claim of their own.
        folded = [o for o in misuse if o.kind == "nccl_error" and o.fields.get("category") != "duplicate_gpu"]
        out.append(_mismatch(explicit, folded, diverged, job))
        folded_set = set(folded)
        misuse = [o for o in misuse if o not in folded_set]
        diverged = []
    if misuse:
        out.append(_invalid_usage_finding(misuse, job))
    if diverged:
        out.append(_divergence(diverged, findings, job))
    return out


def _culprit_mismatch(o: _Occ) -> bool:
    return o.kind == "flight_recorder" and bool(set(o.fields.get("error_types") or ()) & _CALL_MISMATCHES)


def _invalid_usage(o: _Occ) -> bool:
    return o.kind in ("nccl_error", "nccl_warn") and (
        o.fields.get("nccl_code") == _INVALID_USAGE or o.fields.get("category") == "duplicate_gpu"
    )


def _ints(values: Any) -> list[int]:
    return [v for v in values or () if isinstance(v, int) and not isinstance(v, bool)]


def _mismatch(explicit: list[_Occ], misuse: list[_Occ], diverged: list[_Occ], job: _Job) -> Finding:
    ranks = sorted({r for o in explicit for r in _ints(o.fields.get("ranks") or o.fields.get("culprit_ranks"))})
    ops = sorted({str(op) for o in explicit for op in _ops(o)})
    seqs = sorted({s for o in explicit for s in _seqs(o)})
    group = [*explicit, *misuse, *diverged]
    return _finding(
        group,
        key="collective_mismatch",
        category="user_code",
        confidence=0.8,
        summary="collective mismatch: " + _mismatch_words(explicit),
        node=None,
        subject_kind="job",
        subject=job.info.job_id,
        job=job,
        blame="user_code",
        action="none",
        sig_text="collective mismatch " + " ".join(ops),
        mismatch_ranks=ranks[:MAX_LIST] or None,
        ops=ops or None,
        collectives=seqs[:MAX_LIST] or None,
        shapes=sorted({str(s) for o in explicit for s in o.fields.get("shapes") or () if s})[:MAX_LIST] or None,
        lagging_ranks=_lagging(diverged)[:MAX_LIST] or None,
    )


def _ops(o: _Occ) -> list[str]:
    ops = o.fields.get("ops")
    if isinstance(ops, list):
        return [str(op) for op in ops if op]
    return [str(o.fields["op"])] if o.fields.get("op") else []


def _seqs(o: _Occ) -> list[int]:
    return _ints(o.fields.get("seqs")) or _ints([o.fields.get("collective")])


def _mismatch_words(explicit: list[_Occ]) -> str:
    """What the most telling report says: PyTorch's fingerprints, then the analyzer's culprit, NCCL's, the sizes."""
    by_source: dict[str, _Occ] = {}
    for o in explicit:
        by_source.setdefault("flight_recorder" if o.kind == "flight_recorder" else str(o.fields.get("source")), o)
    if (o := by_source.get("pytorch")) and len(_ints(o.fields.get("ranks"))) >= 2:
        return _fingerprints(o.fields)
    if o := by_source.get("flight_recorder"):
        f = o.fields
        culprits = ", ".join(str(r) for r in _ints(f.get("culprit_ranks"))) or "?"
        types = ", ".join(str(t) for t in f.get("error_types") or ())
        return f"rank {culprits} differs in {f.get('op') or 'a collective'} #{f.get('collective')} ({types})"
    if o := by_source.get("nccl"):
        around = _ints(o.fields.get("ranks"))
        return "NCCL found mismatched collective calls" + (f" at and around rank {around[0]}" if around else "")
    o = by_source.get("nccl_net") or explicit[0]
    f = o.fields
    if f.get("local_size") is not None:
        return (
            f"NET/{f.get('transport') or '?'} transfer sizes differ (local {f.get('local_size')} bytes, remote "
            f"{f.get('remote_size')} bytes, peer {f.get('peer') or '?'}): the ranks posted different collectives"
        )
    return str(f.get("message") or "the ranks called different collectives")[:200]


def _fingerprints(f: Any) -> str:
    """ "rank 1 ran ALLREDUCE [25] while rank 0 ran BROADCAST [1] (seq 485)": what differs, per rank."""
    ranks, ops = _ints(f.get("ranks")), list(f.get("ops") or ())
    shapes, dtypes = list(f.get("shapes") or ()), list(f.get("dtypes") or ())
    parts = []
    for i, rank in enumerate(ranks[:2]):
        words = [str(ops[i]) if i < len(ops) and ops[i] else "?"]
        if len(set(shapes[:2])) > 1 and i < len(shapes):
            words.append(str(shapes[i]))
        if len(set(dtypes[:2])) > 1 and i < len(dtypes):
            words.append(str(dtypes[i]))
        parts.append(f"rank {rank} ran {' '.join(words)}")
    seqs = sorted(set(_ints(f.get("seqs"))))
    return " while ".join(parts) + (f" (seq {', '.join(map(str, seqs))})" if seqs else "")


def _lagging(diverged: Sequence[_Occ]) -> list[int]:
    ranks: set[int] = set()
    for o in diverged:
        ranks.update(_ints(o.fields.get("missing_ranks")))
        ranks.update(_ints(o.fields.get("lagging_ranks")))
        ranks.update(_ints(o.fields.get("culprit_ranks")))
    return sorted(ranks)


def _divergence(diverged: list[_Occ], findings: Sequence[Finding], job: _Job) -> Finding:
    """Ranks that did not join (or got elsewhere in) a collective the others were in: the application's, unless an
    infrastructure cause of the job explains those ranks; then that fault's symptom. Never a node's claim."""
    lagging = _lagging(diverged)
    nodes = sorted({n for r in lagging if (n := job.node_of_rank(r))})
    infra = {f.node for f in findings if f.role == "cause" and f.blame == "infrastructure" and f.node}
    explained = bool(infra & set(nodes)) if nodes else bool(infra)
    ops = sorted({op for o in diverged for op in _ops(o)})
    seqs = sorted({s for o in diverged for s in _seqs(o)})
    reporters = sorted({"flight recorder" if o.kind == "flight_recorder" else "desync report" for o in diverged})
    missing = any(o.fields.get("missing_ranks") or o.kind == "desync_report" for o in diverged)
    verb = "never joined" if missing else "got ahead of or behind the others in"
    what = (
        (f"ranks {lagging[:8]} {verb} " if lagging else "ranks missing from ")
        + (", ".join(ops) if ops else "a collective")
        + (f" #{seqs[0]}" if len(seqs) == 1 else "")
        + f" ({', '.join(reporters)})"
    )
    extra: dict[str, Any] = {
        "lagging_ranks": lagging[:MAX_LIST] or None,
        "lagging_nodes": nodes[:MAX_LIST] or None,
        "ops": ops or None,
        "collectives": seqs[:MAX_LIST] or None,
    }
    if explained:
        return _finding(
            diverged,
            key="collective_divergence",
            category="job_failure",
            confidence=0.3,
            summary=f"{what}: waiting on a machine with a fault of its own",
            node=None,
            subject_kind="job",
            subject=job.info.job_id,
            job=job,
            role="symptom",
            sig_text="collective divergence " + " ".join(ops),
            **extra,
        )
    return _finding(
        diverged,
        key="collective_divergence",
        category="user_code",
        confidence=0.5 if missing else 0.4,  # a state mismatch alone is weak: dumps are not taken at one instant
        summary=f"ranks diverged: {what}: different paths through the code, or those ranks hang",
        node=None,
        subject_kind="job",
        subject=job.info.job_id,
        job=job,
        blame="user_code",
        action="none",
        sig_text="collective divergence " + " ".join(ops),
        **extra,
    )


def _invalid_usage_finding(misuse: list[_Occ], job: _Job) -> Finding:
    duplicates = [o for o in misuse if o.fields.get("category") == "duplicate_gpu"]
    if duplicates:
        f = duplicates[0].fields
        pair = _ints(f.get("ranks"))
        which = f"rank {pair[0]} and rank {pair[1]}" if len(pair) == 2 else "two ranks"
        what = (
            f"NCCL invalid usage: {which} both on CUDA device {f.get('cuda_device') or '?'}: the launch gives several "
            "ranks one GPU (select the device from LOCAL_RANK)"
        )
    else:
        what = f"NCCL invalid usage (ncclInvalidUsage){_rank_note(misuse)}: the job's launch configuration or its calls"
    return _finding(
        misuse,
        key="nccl_invalid_usage",
        category="user_code",
        confidence=0.75 if duplicates else 0.6,
        summary=what,
        node=None,
        subject_kind="job",
        subject=job.info.job_id,
        job=job,
        blame="user_code",
        action="none",
        sig_text="nccl invalid usage" + (" duplicate gpu" if duplicates else ""),
        nccl_codes=[_INVALID_USAGE],
        mismatch_ranks=sorted({r for o in duplicates for r in _ints(o.fields.get("ranks"))})[:MAX_LIST] or None,
    )
