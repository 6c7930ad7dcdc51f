"""One fault, one incident: a failed GPU's own link errors are its symptoms, and what the restart after a fault
left behind (a launcher's failure summary) does not join the next fault's incident."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.findings import Finding
from service.incidents.service import resolve
from service.models import Finding as FindingRow
from service.models import Incident, Job
from tests import rows
from tests.decide import decide, finding

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _xid79(node: str, at: datetime) -> Finding:
    key = f"xid79:{node}:{at:%H%M%S}"
    return finding(node, detector="signatures", category="gpu_hardware", at=at, key=key, evidence={"pci": "0000:3b:00"})


def _pcie_replays(node: str, gpu: int, at: datetime) -> Finding:
    return finding(
        node,
        detector="counters",
        category="pcie",
        at=at,
        key=f"pcie:{node}/{gpu}",
        subject_kind="gpu",
        subject=f"{node}/{gpu}",
        action="diagnose",
        evidence={"gpus": [gpu]},
    )


def _launcher_failed(at: datetime) -> Finding:
    key = f"childfailed:{at:%H%M%S}"
    return finding(None, detector="signatures", category="job_failure", at=at, key=key, role="symptom")


def _decide_on(session: Session, job: Job, findings: list[Finding], now: datetime) -> list[Incident]:
    ids = decide(session, job, findings, now).incidents
    return list(session.scalars(select(Incident).where(Incident.id.in_(ids))))


def _incident_of(session: Session, key_part: str) -> int | None:
    return session.scalar(select(FindingRow.incident_id).where(FindingRow.dedup_key.contains(key_part)))


def test_pcie_replays_on_a_gpu_that_fell_off_the_bus_are_its_symptom(session: Session) -> None:
    job, node = rows.job(session), rows.node(session)
    now = T0 + timedelta(seconds=40)
    (incident,) = _decide_on(
        session, job, [_xid79(node.name, T0), _pcie_replays(node.name, 3, T0 + timedelta(seconds=20))], now
    )
    assert incident.root_cause == "gpu_hardware"
    assert _incident_of(session, f"pcie:{node.name}/3") == incident.id
    assert session.scalars(select(Incident.root_cause).where(Incident.job_id == job.id)).all() == ["gpu_hardware"]


def test_pcie_replays_on_another_node_are_their_own_incident(session: Session) -> None:
    job, broken, other = rows.job(session), rows.node(session), rows.node(session)
    now = T0 + timedelta(seconds=40)
    found = _decide_on(
        session, job, [_xid79(broken.name, T0), _pcie_replays(other.name, 1, T0 + timedelta(seconds=20))], now
    )
    assert sorted(i.root_cause for i in found) == ["gpu_hardware", "pcie"]


def test_the_restart_after_a_fault_leaves_nothing_in_the_next_faults_incident(session: Session) -> None:
    job, first, second = rows.job(session), rows.node(session), rows.node(session)
    (earlier,) = _decide_on(session, job, [_xid79(first.name, T0)], T0 + timedelta(seconds=10))
    resolve(session, incident=earlier, resolution="mitigated: evict done", now=T0 + timedelta(minutes=1))

    # The job restarts around the evicted machine; the launcher's summary of the killed ranks comes after.
    leftover = _launcher_failed(T0 + timedelta(minutes=1, seconds=30))
    assert _decide_on(session, job, [leftover], T0 + timedelta(minutes=2)) == []

    later = T0 + timedelta(minutes=3)
    (incident,) = _decide_on(session, job, [leftover, _xid79(second.name, later)], later + timedelta(seconds=5))
    assert [s["node"] for s in incident.suspects] == [second.name]
    # It is the evicted machine's (resolved) incident's evidence: it never floats until it joins a later one.
    assert _incident_of(session, "childfailed:") == earlier.id and earlier.state == "resolved"
