"""Issue 26, on a real GPU: a kernel writing to an unmapped address in one rank (the driver's Xid 31 MMU fault plus
cudaErrorIllegalAddress in that rank's traceback) names the application (blame user code, restart it), unless the
same machine had the fault under another job or another program: then the machine is diagnosed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training import TrainingLogParser
from ml import signatures
from ml.findings import JobInfo, LogRecord
from service.config import get_settings
from service.diagnosis import service as diagnosis
from service.jobs import service as jobs
from service.models import Decision, Finding, Incident
from tests import jobs as seeded
from tests import paths
from tests.stored import check_evidence

# The driver's own line for a CuPy kernel writing to an unmapped address on an H200 (tests/fixtures/hardware/h200).
XID_31 = next(
    line
    for line in (paths.FIXTURES / "hardware" / "h200" / "xid_kernel.txt").read_text().splitlines()
    if "Xid" in line and ": 31," in line
)
TRACEBACK = """[rank{rank}]: Traceback (most recent call last):
[rank{rank}]:   File "/app/train.py", line 88, in <module>
[rank{rank}]:     out = scatter(x, index)
[rank{rank}]:   File "cupy/_core/_kernel.pyx", line 1375, in cupy._core._kernel.ElementwiseKernel.__call__
[rank{rank}]: cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered
"""  # noqa: E501


def _events(text: str, parser: Any, now: datetime) -> list[Any]:
    return list(parse_text(parser, text, now=now))


def _records(node: str, rank: int, now: datetime, **xid_fields: Any) -> list[LogRecord]:
    events = [
        *_events(XID_31 + "\n", KernelLogParser(), now),
        *_events(TRACEBACK.format(rank=rank), TrainingLogParser(), now),
    ]
    return [
        LogRecord(id=i, ts=now, node=node, kind=e.kind, line=e.line, severity=e.severity, rank=e.rank, source=e.source,
                  fields={**e.fields, **(xid_fields if e.kind == "xid" else {})})
        for i, e in enumerate(events, 1)
    ]  # fmt: skip


JOB = JobInfo("j", world_size=16, rank_nodes={r: f"node-{r // 8:03d}" for r in range(16)})


def test_the_mmu_fault_with_an_illegal_address_names_the_application() -> None:
    found = signatures.detect(JOB, _records("node-001", 13, datetime.now(UTC)))
    check_evidence(found)
    assert len(found) == 1, [f.summary for f in found]
    (f,) = found
    assert (f.category, f.blame, f.action, f.node) == ("user_code", "user_code", "restart", None)
    assert f.evidence["nodes"] == ["node-001"] and f.evidence["ranks"] == [13] and f.evidence["xid"] == 31
    assert "restart the application" in f.summary


def test_the_same_fault_repeated_elsewhere_makes_the_machine_the_suspect() -> None:
    records = _records("node-001", 13, datetime.now(UTC), repeated_elsewhere=["job other-7"])
    (f,) = signatures.detect(JOB, records)
    check_evidence([f])
    assert (f.category, f.blame, f.action, f.node) == ("gpu_hardware", "infrastructure", "diagnose", "node-001")
    assert f.evidence["repeated_elsewhere"] == ["job other-7"]


def test_the_mmu_fault_alone_is_a_suspect_and_the_illegal_address_alone_the_applications() -> None:
    records = _records("node-001", 13, datetime.now(UTC))
    (f,) = signatures.detect(JOB, [r for r in records if r.kind == "xid"])
    assert (f.blame, f.action, f.node) == ("unknown", "diagnose", "node-001")
    # No hardware signal beside it (issue 41): the application's, until the machine repeats it under other jobs
    # (tests/service/diagnosis/test_illegal_address_repeats.py).
    (f,) = signatures.detect(JOB, [r for r in records if r.kind == "traceback"])
    assert (f.blame, f.action, f.node) == ("user_code", "restart", None)


def _store_events(
    session: Session, node: str, job: str, rank: int, at: datetime, *, program: str | None = None
) -> None:
    line = XID_31.replace("name=python3", f"name={program}") if program else XID_31
    events = [
        *_events(line + "\n", KernelLogParser(), at),
        *_events(TRACEBACK.format(rank=rank), TrainingLogParser(), at),
    ]
    seeded.store(session, node, job, at, events)


def _job(session: Session, nodes: list[str]) -> str:
    return seeded.register(session, nodes, prefix="mmu")


def _decisions(session: Session, job: str) -> list[tuple[str, str | None]]:
    rows = session.execute(
        select(Decision.kind, Decision.node_id, Incident.blame)
        .join(Incident, Incident.id == Decision.incident_id)
        .where(Incident.job_id == jobs.get_by_external_id(session, job_id=job).id)
    ).all()
    return sorted((kind, blame) for kind, _, blame in rows)


def test_a_pass_restarts_the_application_and_accuses_no_machine(session: Session) -> None:
    tag = uuid.uuid4().hex[:6]
    nodes = [f"mmu-{tag}-{n}" for n in range(2)]
    job = _job(session, nodes)
    now = datetime.now(UTC)
    _store_events(session, nodes[1], job, 13, now - timedelta(seconds=20))
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _decisions(session, job) == [("restart", "user_code")]
    assert (
        session.scalars(
            select(Decision.node_id).where(Decision.node_id.is_not(None), Decision.reason.contains(job))
        ).all()
        == []
    )


def test_a_machine_that_had_it_under_another_job_is_diagnosed(session: Session) -> None:
    tag = uuid.uuid4().hex[:6]
    nodes = [f"mmu-{tag}-{n}" for n in range(2)]
    now = datetime.now(UTC)
    earlier = _job(session, nodes)
    _store_events(session, nodes[1], earlier, 9, now - timedelta(hours=5))
    job = _job(session, nodes)
    _store_events(session, nodes[1], job, 13, now - timedelta(seconds=20))
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _decisions(session, job) == [("diagnose", "infrastructure")]
    finding = session.scalars(select(Finding).where(Finding.dedup_key.contains(f"app_fault:{nodes[1]}:repeated"))).one()
    assert finding.evidence["repeated_elsewhere"] == [f"job {earlier}"]


def test_a_machine_that_had_it_under_another_program_is_diagnosed(session: Session) -> None:
    tag = uuid.uuid4().hex[:6]
    nodes = [f"mmu-{tag}-{n}" for n in range(2)]
    now = datetime.now(UTC)
    job = _job(session, nodes)
    _store_events(session, nodes[0], job, 2, now - timedelta(minutes=50), program="gpu-burn")
    _store_events(session, nodes[0], job, 2, now - timedelta(seconds=20))
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _decisions(session, job) == [("diagnose", "infrastructure")]
