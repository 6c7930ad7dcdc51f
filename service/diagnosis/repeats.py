"""Faults that are the application's unless the machine repeats them: the records are marked `repeated_elsewhere`
with where else the same machine had them, for ml/signatures/app_faults.py to read.

- Xid 31 (MMU fault): the other jobs ("job X") and other programs ("program Y") the machine had one under lately.
- An illegal memory access (a CUDA error, alone or in a traceback or crash): the other jobs in which this machine,
  and no other machine of that job, had one lately. A bug in the code fails on every node that runs it; a GPU that
  corrupts memory fails under whatever runs on it, and only there.

Reads nothing when the window holds neither.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from ml.findings import LogRecord
from service.models import Job, LogEvent, Node

MMU_FAULT_XID = 31
HISTORY = timedelta(days=7)
ILLEGAL_ADDRESS = "illegal_memory_access"
# The kinds an illegal memory access arrives as: the runtime's error line, or a block that wraps it.
_WRAPPING = ("traceback", "crash", "cpp_exception", "child_failed")


def illegal_address(record: LogRecord) -> bool:
    """Whether the record is (or wraps) CUDA's illegal memory access."""
    if record.kind == "cuda_error":
        return record.fields.get("error") == ILLEGAL_ADDRESS
    error = record.fields.get("error")
    return record.kind in _WRAPPING and isinstance(error, dict) and error.get("error") == ILLEGAL_ADDRESS


def mark_repeated(session: Session, *, job: Job, records: list[LogRecord], horizon: timedelta) -> list[LogRecord]:
    """`records` with the application-looking faults of machines that had them elsewhere marked."""
    elsewhere: dict[int, list[str]] = {}
    faults = [r for r in records if r.kind == "xid" and r.fields.get("xid") == MMU_FAULT_XID]
    if faults:
        found = _mmu_elsewhere(session, job=job, faults=faults, horizon=horizon)
        elsewhere.update({id(r): found[r.node] for r in faults if r.node in found})
    errors = [r for r in records if illegal_address(r)]
    if errors:
        found = _illegal_elsewhere(session, job=job, errors=errors, horizon=horizon)
        elsewhere.update({id(r): found[r.node] for r in errors if r.node in found})
    if not elsewhere:
        return records
    return [
        replace(r, fields={**r.fields, "repeated_elsewhere": elsewhere[id(r)]}) if id(r) in elsewhere else r
        for r in records
    ]


def _mmu_elsewhere(session: Session, *, job: Job, faults: list[LogRecord], horizon: timedelta) -> dict[str, list[str]]:
    programs = {(r.node, r.fields.get("process")) for r in faults}
    since = min(r.ts for r in faults) - HISTORY
    rows = session.execute(
        select(Node.name, Job.external_id, LogEvent.fields["process"].astext)
        .join(Node, Node.id == LogEvent.node_id)
        .outerjoin(Job, Job.id == LogEvent.job_id)
        .where(
            Node.name.in_(sorted({r.node for r in faults})),
            LogEvent.kind == "xid",
            LogEvent.fields["xid"].astext == str(MMU_FAULT_XID),
            LogEvent.ts >= since,
            LogEvent.ts < since + HISTORY + horizon,
        )
        .distinct()
    ).all()
    found: dict[str, set[str]] = defaultdict(set)
    for node, other_job, program in rows:
        if other_job is not None and other_job != job.external_id:
            found[node].add(f"job {other_job}")
        elif program and (node, program) not in programs:
            found[node].add(f"program {program}")
    return {node: sorted(where) for node, where in found.items()}


def _illegal_filter() -> Any:
    return or_(
        and_(LogEvent.kind == "cuda_error", LogEvent.fields["error"].astext == ILLEGAL_ADDRESS),
        and_(LogEvent.kind.in_(_WRAPPING), LogEvent.fields["error"]["error"].astext == ILLEGAL_ADDRESS),
    )


def _illegal_elsewhere(
    session: Session, *, job: Job, errors: list[LogRecord], horizon: timedelta
) -> dict[str, list[str]]:
    since = min(r.ts for r in errors) - HISTORY
    window = (LogEvent.ts >= since, LogEvent.ts < since + HISTORY + horizon)
    mine = session.execute(
        select(Node.name, LogEvent.job_id)
        .join(Node, Node.id == LogEvent.node_id)
        .where(Node.name.in_(sorted({r.node for r in errors})), LogEvent.job_id != job.id, _illegal_filter(), *window)
        .distinct()
    ).all()
    if not mine:
        return {}
    # Every machine that had one in those jobs: a job where others had it too is that job's bug.
    rows = session.execute(
        select(LogEvent.job_id, Job.external_id, LogEvent.node_id)
        .join(Job, Job.id == LogEvent.job_id)
        .where(LogEvent.job_id.in_({j for _, j in mine}), _illegal_filter(), *window)
        .distinct()
    ).all()
    nodes_per_job: dict[int, set[int]] = defaultdict(set)
    names: dict[int, str] = {}
    for job_id, external_id, node_id in rows:
        nodes_per_job[job_id].add(node_id)
        names[job_id] = external_id
    found: dict[str, set[str]] = defaultdict(set)
    for node, other in _alone(mine, nodes_per_job):
        found[node].add(f"job {names[other]}")
    return {node: sorted(where) for node, where in found.items()}


def _alone(mine: Iterable[Any], nodes_per_job: dict[int, set[int]]) -> Iterable[tuple[str, int]]:
    """(node, job) pairs where the node was the job's only machine with the fault."""
    for node, other in mine:
        if len(nodes_per_job.get(other, ())) == 1:
            yield node, other
