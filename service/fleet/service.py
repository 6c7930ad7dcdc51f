"""Repair times of incidents and spare-capacity advice, read from the stored incidents and node histories.

The arithmetic is pure (ml/repair_times.py, ml/spares.py); this module only reads the rows it needs, in a fixed
number of queries whatever the window holds. It imports no other domain: incidents, decisions and nodes call its
stage hooks (stages.py), so importing them back would make a cycle.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import Select, distinct, func, select
from sqlalchemy.orm import Session

from ml import repair_times, spares
from ml.repair_times import BACK, DecisionRow, IncidentTimes
from service.errors import Conflict, NotFound
from service.fleet.stages import OUT_OF_SERVICE, TAKEN_OUT
from service.models import Decision, Finding, Incident, Job, Node, NodeEvent, Rank
from service.models.planned import not_planned


def _counted(since: datetime, now: datetime) -> Select[tuple[int]]:
    # Merged-away incidents repeat another one (their findings moved there): they would count twice.
    return select(Incident.id).where(
        Incident.opened_at >= since,
        Incident.opened_at <= now,
        func.coalesce(Incident.resolution, "").not_like("merged%"),
        # A planned maintenance window's node going down is no failure (service/planned/).
        not_planned(Incident.silence_id),
    )


def first_evidence(session: Session, *, incident_ids: list[int]) -> dict[int, datetime]:
    """Each incident's earliest fault evidence (its first finding's `observed_at`); those without findings absent."""
    return dict(
        session.execute(
            select(Finding.incident_id, func.min(Finding.observed_at))
            .where(Finding.incident_id.in_(incident_ids))
            .group_by(Finding.incident_id)
        ).all()
    )


def _times(session: Session, ids: Select[tuple[int]]) -> list[IncidentTimes]:
    """Every listed incident's stages, in five queries."""
    incidents = session.execute(
        select(Incident.id, Incident.root_cause, Incident.opened_at).where(Incident.id.in_(ids)).order_by(Incident.id)
    ).all()
    if not incidents:
        return []
    wanted = [i.id for i in incidents]
    evidence = first_evidence(session, incident_ids=wanted)
    decisions: dict[int, list[DecisionRow]] = defaultdict(list)
    for row in session.execute(
        select(Decision.incident_id, Node.name, Decision.state, Decision.created_at, Decision.acked_at)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.incident_id.in_(wanted))
    ):
        decisions[row.incident_id].append(
            DecisionRow(node=row.name, state=row.state, created_at=row.created_at, acked_at=row.acked_at)
        )
    outs: dict[int, list[tuple[str, datetime]]] = defaultdict(list)
    out_nodes: dict[int, str] = {}
    for row in session.execute(
        select(NodeEvent.incident_id, NodeEvent.node_id, Node.name, NodeEvent.at)
        .join(Node, Node.id == NodeEvent.node_id)
        .where(
            NodeEvent.incident_id.in_(wanted),
            NodeEvent.to_state.in_(TAKEN_OUT),
            NodeEvent.from_state.not_in(OUT_OF_SERVICE),
        )
    ):
        outs[row.incident_id].append((row.name, row.at))
        out_nodes[row.node_id] = row.name
    backs: dict[str, list[datetime]] = defaultdict(list)
    if out_nodes:
        earliest = min(at for rows in outs.values() for _, at in rows)
        for node_id, at in session.execute(
            select(NodeEvent.node_id, NodeEvent.at).where(
                NodeEvent.node_id.in_(out_nodes),
                NodeEvent.to_state.in_(BACK),
                NodeEvent.from_state.in_(OUT_OF_SERVICE),
                NodeEvent.at >= earliest,
            )
        ):
            backs[out_nodes[node_id]].append(at)
    return [
        repair_times.incident_times(
            incident_id=i.id,
            root_cause=i.root_cause,
            opened_at=i.opened_at,
            evidence_at=evidence.get(i.id),
            decisions=decisions[i.id],
            outs=outs[i.id],
            backs=backs,
        )
        for i in incidents
    ]


def incident_times(session: Session, *, incident_id: int) -> IncidentTimes:
    """One incident's repair times."""
    if session.get(Incident, incident_id) is None:
        raise NotFound(f"no incident {incident_id}")
    return _times(session, select(Incident.id).where(Incident.id == incident_id))[0]


def window_times(session: Session, *, window_s: float, now: datetime) -> list[IncidentTimes]:
    """Repair times of the incidents opened within the window before `now`."""
    return _times(session, _counted(now - timedelta(seconds=window_s), now))


def repair_times_by(
    session: Session, *, window_s: float, by: str, now: datetime
) -> tuple[list[repair_times.Group], int]:
    """p50/p90 per stage per group, and the number of incidents counted."""
    times = window_times(session, window_s=window_s, now=now)
    return repair_times.aggregate(times, by=by), len(times)


def failure_history(session: Session, *, window_s: float, now: datetime) -> tuple[dict[str, int], float]:
    """Failures (a node evicted or cordoned for an incident) per root cause, and node-hours observed, in the window.

    A node is observed from when it was first seen (or the window's start) to now, out-of-service time included:
    the rate per node-hour comes out slightly low for a fleet with many nodes out for long.
    """
    since = now - timedelta(seconds=window_s)
    failures = dict(
        session.execute(
            select(Incident.root_cause, func.count())
            .select_from(NodeEvent)
            .join(Incident, Incident.id == NodeEvent.incident_id)
            .where(
                NodeEvent.to_state.in_(TAKEN_OUT),
                NodeEvent.from_state.not_in(OUT_OF_SERVICE),
                NodeEvent.at >= since,
                NodeEvent.at <= now,
            )
            .group_by(Incident.root_cause)
        ).all()
    )
    seconds = session.scalar(
        select(func.sum(func.extract("epoch", now - func.greatest(Node.created_at, since)))).where(
            Node.created_at < now
        )
    )
    return failures, float(seconds or 0) / 3600


def spares_for(
    session: Session, *, nodes: int, horizon_s: float, quantile: float, window_s: float, now: datetime
) -> spares.Advice:
    """Warm standbys for a job of `nodes` nodes, from the fleet's failure history over the window."""
    failures, node_hours = failure_history(session, window_s=window_s, now=now)
    return spares.advise(
        nodes=nodes,
        horizon_h=horizon_s / 3600,
        quantile=quantile,
        failures_by_root_cause=failures,
        node_hours=node_hours,
    )


def job_nodes(session: Session, *, job_id: str) -> int:
    """How many nodes the job's ranks are placed on (404 for an unknown job)."""
    job = session.scalar(select(Job.id).where(Job.external_id == job_id))
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return int(session.scalar(select(func.count(distinct(Rank.node_id))).where(Rank.job_id == job)) or 0)


def job_spares(
    session: Session,
    *,
    job_id: str,
    nodes: int | None,
    horizon_s: float,
    quantile: float,
    window_s: float,
    now: datetime,
) -> spares.Advice:
    """Standbys for a job: its placed nodes, or `nodes` when given (409 when neither is known)."""
    placed = job_nodes(session, job_id=job_id)
    if nodes is None:
        if placed == 0:
            raise Conflict(f"job {job_id} has no rank placed on a node yet: pass nodes=N to size its standbys")
        nodes = placed
    return spares_for(session, nodes=nodes, horizon_s=horizon_s, quantile=quantile, window_s=window_s, now=now)
