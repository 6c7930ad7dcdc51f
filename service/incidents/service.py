"""Incidents: one open per job and root cause, kept in step with the job's findings; read for the API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ml.demarcation import IncidentProposal
from service.decisions import service as decisions
from service.errors import NotFound
from service.incidents.schemas import FindingOut, IncidentOut, IncidentPage, SuspectOut
from service.models import Finding, Incident, Job, Node
from service.pagination import decode_cursor, encode_cursor


def open_incident(session: Session, *, job: Job, root_cause: str) -> Incident:
    """The job's open incident for this root cause, created if there is none (race-free: partial unique index)."""
    session.execute(
        insert(Incident)
        .values(job_id=job.id, root_cause=root_cause)
        .on_conflict_do_nothing(index_elements=["job_id", "root_cause"], index_where=text("state <> 'resolved'"))
    )
    incident = session.scalar(
        select(Incident)
        .where(Incident.job_id == job.id, Incident.root_cause == root_cause, Incident.state != "resolved")
        .with_for_update()
    )
    assert incident is not None  # inserted above or already there
    return incident


def apply_proposals(
    session: Session, *, job: Job, proposals: Sequence[IncidentProposal], now: datetime
) -> list[Incident]:
    """Bring the job's open incidents in line with the demarcation: one per proposal, in proposal order."""
    touched: list[Incident] = []
    for proposal in proposals:
        incident = open_incident(session, job=job, root_cause=proposal.root_cause)
        incident.blame = proposal.blame
        incident.confidence = proposal.confidence
        incident.severity = proposal.severity
        incident.summary = proposal.summary
        incident.suspects = [{**asdict(s), "finding_ids": list(s.finding_ids)} for s in proposal.suspects]
        incident.updated_at = now
        session.execute(
            update(Finding)
            .where(Finding.id.in_(proposal.finding_ids), Finding.incident_id.is_distinct_from(incident.id))
            .values(incident_id=incident.id)
        )
        touched.append(incident)
    _resolve_emptied(session, job=job, keep={i.id for i in touched}, now=now)
    session.flush()
    return touched


def _resolve_emptied(session: Session, *, job: Job, keep: set[int], now: datetime) -> None:
    """An open incident whose findings all moved to another (a hang explained by a lost GPU) is merged."""
    for incident in session.scalars(
        select(Incident).where(Incident.job_id == job.id, Incident.state != "resolved", Incident.id.not_in(keep or {0}))
    ):
        has_findings = session.scalar(select(Finding.id).where(Finding.incident_id == incident.id).limit(1))
        if has_findings is None:
            incident.state = "resolved"
            incident.resolved_at = now
            incident.summary = (
                f"{incident.summary or incident.root_cause} (merged: its findings belong to another incident)"
            )


def get(session: Session, *, incident_id: int) -> IncidentOut:
    incident = session.get(Incident, incident_id)
    if incident is None:
        raise NotFound(f"no incident {incident_id}")
    job_id = session.scalar(select(Job.external_id).where(Job.id == incident.job_id)) or ""
    rows = session.execute(
        select(Finding, Node.name)
        .outerjoin(Node, Node.id == Finding.node_id)
        .where(Finding.incident_id == incident.id)
        .order_by(Finding.observed_at, Finding.id)
    ).all()
    return _out(
        incident,
        job_id=job_id,
        findings=[_finding_out(f, node) for f, node in rows],
        decisions=decisions.for_incident(session, incident_id=incident.id),
    )


def list_incidents(
    session: Session, *, job: str | None, state: str | None, limit: int, cursor: str | None
) -> IncidentPage:
    """Newest first, keyset-paginated on id."""
    query = select(Incident, Job.external_id).join(Job, Job.id == Incident.job_id).order_by(Incident.id.desc())
    if job:
        query = query.where(Job.external_id == job)
    if state:
        query = query.where(Incident.state == state)
    if cursor:
        query = query.where(Incident.id < decode_cursor(cursor))
    rows = session.execute(query.limit(limit + 1)).all()
    items = [_out(i, job_id=j) for i, j in rows[:limit]]
    return IncidentPage(items=items, next_cursor=encode_cursor(rows[limit - 1][0].id) if len(rows) > limit else None)


def _out(incident: Incident, *, job_id: str, findings=None, decisions=None) -> IncidentOut:  # type: ignore[no-untyped-def]
    return IncidentOut(
        id=incident.id,
        job_id=job_id,
        state=incident.state,
        root_cause=incident.root_cause,
        blame=incident.blame,
        severity=incident.severity,
        confidence=incident.confidence,
        summary=incident.summary,
        suspects=[SuspectOut(**s) for s in incident.suspects or []],
        opened_at=incident.opened_at,
        updated_at=incident.updated_at,
        resolved_at=incident.resolved_at,
        findings=findings or [],
        decisions=decisions or [],
    )


def _finding_out(f: Finding, node: str | None) -> FindingOut:
    return FindingOut(
        id=f.id,
        detector=f.detector,
        category=f.category,
        subject_kind=f.subject_kind,
        subject=f.subject,
        node=node,
        confidence=f.confidence,
        blame=f.blame,
        role=f.role,
        action=f.action,
        summary=f.summary,
        evidence=f.evidence,
        observed_at=f.observed_at,
        created_at=f.created_at,
    )
