"""Incidents: one open per job, root cause and machine (a machine fault's), kept in step with the job's findings;
read for the API."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import Exists, Float, Row, case, func, or_, select, text, true, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ml.demarcation import IncidentProposal
from service.config import Settings
from service.decisions import lifecycle as decision_lifecycle
from service.decisions import service as decisions
from service.errors import Conflict, NotFound
from service.fleet import stages as repair_stages
from service.incidents.schemas import FindingOut, IncidentOut, IncidentPage
from service.jobs import service as jobs
from service.models import Decision, Finding, Incident, Job, Node
from service.nodes import lifecycle as nodes
from service.notify import service as notify
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined

# Decisions whose completion ends an incident: the job runs again without the fault.
_REMEDIES = ("evict", "reset_gpu", "restart", "rollback")
# Most severe first: the overview lists open incidents in this order, any other severity after them all.
SEVERITIES = ("critical", "major", "minor")
_SEVERITY_ORDER = case({s: i for i, s in enumerate(SEVERITIES)}, value=Incident.severity, else_=len(SEVERITIES))


def open_incident(session: Session, *, job: Job, root_cause: str, anchor: str = "") -> tuple[Incident, bool]:
    """The job's open incident for this root cause and machine ("" for a job-wide one), created if there is none
    (race-free: partial unique index). The flag says whether this call created it."""
    for _ in range(3):
        found = _open_one(session, job=job, root_cause=root_cause, anchor=anchor)
        if found is not None:
            return found, False
        # Only when none is open: an INSERT that runs into the open incident still draws a number from the id
        # sequence, and every diagnosis pass asking for its open incidents made the numbers people see jump
        # (#3, then #69). The insert below now loses a number only in a race between two workers.
        created = session.scalar(
            insert(Incident)
            .values(job_id=job.id, root_cause=root_cause, anchor=anchor)
            .on_conflict_do_nothing(
                index_elements=["job_id", "root_cause", "anchor"], index_where=text("state <> 'resolved'")
            )
            .returning(Incident.id)
        )
        incident = _open_one(session, job=job, root_cause=root_cause, anchor=anchor)
        if incident is not None:
            return incident, created is not None
        # The open incident the insert ran into was resolved in between (the beat's quiet resolution committed
        # after the insert looked and before this read): insert again.
    raise RuntimeError(f"no open {root_cause} incident for job {job.external_id} after three tries")


def _open_one(session: Session, *, job: Job, root_cause: str, anchor: str) -> Incident | None:
    """The job's open incident for this root cause and machine, locked; None when there is none."""
    return session.scalar(
        select(Incident)
        .where(
            Incident.job_id == job.id,
            Incident.root_cause == root_cause,
            Incident.anchor == anchor,
            Incident.state != "resolved",
        )
        .with_for_update()
    )


@dataclass
class Applied:
    incidents: list[Incident]  # one per proposal, in proposal order
    created: set[int]  # ids of the incidents this pass opened


def apply_proposals(
    session: Session, *, job: Job, proposals: Sequence[IncidentProposal], fresh: Collection[int], now: datetime
) -> Applied:
    """Bring the job's open incidents in line with the demarcation: one per proposal, in proposal order.

    `fresh`: the ids of the findings that are new evidence this pass (stored, or a series that moved); only
    they move an incident's `updated_at`, which the quiet resolution reads."""
    touched: list[Incident] = []
    created: set[int] = set()
    for proposal in proposals:
        incident, new = open_incident(session, job=job, root_cause=proposal.root_cause, anchor=proposal.anchor)
        if new:
            created.add(incident.id)
            repair_stages.incident_opened(session, finding_ids=proposal.finding_ids, now=now)
        incident.blame = proposal.blame
        incident.confidence = proposal.confidence
        incident.severity = proposal.severity
        incident.summary = proposal.summary
        incident.suspects = [{**asdict(s), "finding_ids": list(s.finding_ids)} for s in proposal.suspects]
        if new or not fresh.isdisjoint(proposal.finding_ids):
            incident.updated_at = now
        session.execute(
            update(Finding)
            .where(Finding.id.in_(proposal.finding_ids), Finding.incident_id.is_distinct_from(incident.id))
            .values(incident_id=incident.id)
        )
        touched.append(incident)
    _resolve_emptied(session, job=job, keep={i.id for i in touched}, now=now)
    session.flush()
    return Applied(incidents=touched, created=created)


def _resolve_emptied(session: Session, *, job: Job, keep: set[int], now: datetime) -> None:
    """An open incident whose findings all moved to another (a hang explained by a lost GPU) is merged."""
    for incident in session.scalars(
        select(Incident).where(Incident.job_id == job.id, Incident.state != "resolved", Incident.id.not_in(keep or {0}))
    ):
        has_findings = session.scalar(select(Finding.id).where(Finding.incident_id == incident.id).limit(1))
        if has_findings is None:
            # Merged away, not a state change worth a chat message of its own: nobody acted on it.
            incident.state = "resolved"
            incident.resolved_at = now
            incident.resolution = "merged: its findings belong to another incident"


def resolve(session: Session, *, incident: Incident, resolution: str, now: datetime) -> bool:
    """Close an incident: its suspects nothing else accuses are healthy again; chat hears of it."""
    if incident.state == "resolved":
        return False
    incident.state = "resolved"
    incident.resolved_at = now
    incident.updated_at = now
    incident.resolution = resolution[:500]
    nodes.clear_suspects(session, incident=incident, now=now)
    notify.record_incident_event(session, incident=incident, event="resolved", now=now)
    return True


def resolve_by_hand(
    session: Session, *, incident_id: int, reason: str, actor: str, now: datetime, settings: Settings
) -> IncidentOut:
    """A person closes an incident, with a reason: what still waits on anyone for it is rejected in their name."""
    incident = session.scalar(select(Incident).where(Incident.id == incident_id).with_for_update())
    if incident is None:
        raise NotFound(f"no incident {incident_id}")
    if incident.state == "resolved":
        raise Conflict(
            f"incident {incident_id} is already resolved ({incident.resolved_at:%Y-%m-%d %H:%M:%S} UTC): "
            f"{incident.resolution or 'no reason recorded'}"
        )
    resolve(session, incident=incident, resolution=f"by hand: {reason}", now=now)
    incident.resolved_by = actor
    waiting = session.scalars(
        select(Decision.id).where(
            Decision.incident_id == incident.id, Decision.state.in_(("pending", "awaiting_approval"))
        )
    ).all()
    for decision_id in waiting:
        decision_lifecycle.reject(
            session,
            decision_id=decision_id,
            message=f"incident {incident.id} resolved by {actor}: {reason}"[:2000],
            actor=actor,
            now=now,
            settings=settings,
        )
    session.flush()
    return get(session, incident_id=incident.id)


def acknowledge(session: Session, *, incident_id: int, actor: str, note: str | None, now: datetime) -> IncidentOut:
    """A person says "I'm on it": who and when, kept on the incident and in its record of acknowledgements. Its
    state and decisions stay as they are; the same person again changes nothing, another takes it over."""
    incident = session.scalar(select(Incident).where(Incident.id == incident_id).with_for_update())
    if incident is None:
        raise NotFound(f"no incident {incident_id}")
    if incident.state == "resolved":
        when = f" ({incident.resolved_at:%Y-%m-%d %H:%M:%S} UTC)" if incident.resolved_at else ""
        raise Conflict(f"incident {incident_id} is already resolved{when}: there is nothing left to be on")
    if incident.acknowledged_by != actor:
        incident.acknowledged_by = actor
        incident.acknowledged_at = now
        entry = {"actor": actor, "at": now.isoformat(), "note": note or None}
        incident.acknowledgements = [*(incident.acknowledgements or []), entry]
        session.flush()
    return get(session, incident_id=incident.id)


def resolve_if_mitigated(session: Session, *, incident: Incident, now: datetime) -> bool:
    """Resolved once a scheduler carried out its remedy and nothing else about it waits on anyone."""
    rows = session.execute(
        select(Decision.kind, Decision.state, Node.name)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.incident_id == incident.id)
    ).all()
    if any(state in ("pending", "awaiting_approval") for _, state, _ in rows):
        return False
    done = [(kind, node) for kind, state, node in rows if state == "done" and kind in _REMEDIES]
    if not done:
        return False
    what = ", ".join(f"{kind} {node}" if node else kind for kind, node in done)
    return resolve(session, incident=incident, resolution=f"mitigated: {what} done", now=now)


@decision_lifecycle.after_finish
def _resolve_after_decision(session: Session, decision: Decision, now: datetime) -> None:
    """A decision just closed: if it was its incident's remedy and nothing else waits, the incident resolves; an
    eviction carried out also settles the job's other incidents about the machine it took away."""
    if decision.incident_id is not None:
        incident = session.get(Incident, decision.incident_id)
        if incident is not None:
            resolve_if_mitigated(session, incident=incident, now=now)
    if decision.kind == "evict" and decision.state == "done" and decision.node_id and decision.job_id:
        _resolve_left_machine(session, decision=decision, now=now)


def _waiting_on_anyone() -> Exists:
    """Whether a decision of the incident in the outer query still waits for a scheduler or a person."""
    return (
        select(Decision.id)
        .where(Decision.incident_id == Incident.id, Decision.state.in_(decision_lifecycle.OPEN))
        .exists()
    )


def _resolve_left_machine(session: Session, *, decision: Decision, now: datetime) -> list[int]:
    """The job's other open incidents anchored at the machine an eviction just took out of the job, with nothing
    waiting on anyone: their machine is gone as their own remedy would have taken it (a node out for its stop-time
    checks still under memory pressure opened one of its own, which its checks' eviction then left open)."""
    name = session.scalar(select(Node.name).where(Node.id == decision.node_id))
    others = session.scalars(
        select(Incident)
        .where(
            Incident.job_id == decision.job_id,
            Incident.anchor == name,
            Incident.state != "resolved",
            Incident.id != decision.incident_id,
            ~_waiting_on_anyone(),
        )
        .order_by(Incident.id)
        .with_for_update()
    ).all()
    why = f"mitigated: its machine {name} evicted from the job (decision {decision.id})"
    return [i.id for i in others if resolve(session, incident=i, resolution=why, now=now)]


def resolve_quiet(
    session: Session, *, now: datetime, quiet_s: float, job_ids: Collection[int] | None = None
) -> list[int]:
    """Incidents without new evidence for `quiet_s` and with nothing waiting on anyone resolve themselves.

    `job_ids`: only those jobs' incidents (callers whose processes each keep their own clock: one process's now
    resolved another's incidents as quiet minutes early); every job's by default."""
    quiet = session.scalars(
        select(Incident)
        .where(
            Incident.state != "resolved",
            Incident.updated_at < now - timedelta(seconds=quiet_s),
            ~_waiting_on_anyone(),
            Incident.job_id.in_(job_ids) if job_ids is not None else true(),
        )
        .order_by(Incident.id)
        .limit(500)
        .with_for_update(skip_locked=True)
    ).all()
    # Every node these incidents name, locked at once in name order: resolving them one by one would lock nodes
    # in incident order, and a diagnosis pass locking the same nodes in another order deadlocked with it.
    nodes.lock(session, names=(s["node"] for i in quiet for s in i.suspects or [] if s.get("node")))
    minutes = f"{quiet_s / 60:g} min"
    return [
        i.id for i in quiet if resolve(session, incident=i, resolution=f"quiet: no new evidence for {minutes}", now=now)
    ]


# Job-wide causes that stop the job, or spoil its training (NaN loss): once it trains again without new evidence
# they are over, whoever relaunched or rolled it back.
RECOVERS_BY_TRAINING = ("hang", "job_failure", "user_code", "oom", "nan")


def resolve_recovered(
    session: Session, *, now: datetime, after_s: float, job_ids: Collection[int] | None = None
) -> list[int]:
    """Job-wide incidents of a cause that stops the job (RECOVERS_BY_TRAINING) whose job logged a step `after_s`
    past their last evidence resolve as recovered: the user fixed the bug and relaunched, or the hang cleared.

    Their job-level decisions still waiting (a rollback nobody carried out, since the user relaunched) are moot and
    expire; one still waiting for a node (an eviction for a scheduler) keeps the incident open. `job_ids`: as for
    resolve_quiet."""
    candidates = session.scalars(
        select(Incident)
        .where(
            Incident.state != "resolved",
            Incident.anchor == "",
            Incident.root_cause.in_(RECOVERS_BY_TRAINING),
            Incident.updated_at < now - timedelta(seconds=after_s),
            Incident.job_id.in_(job_ids) if job_ids is not None else true(),
        )
        .order_by(Incident.id)
        .limit(500)
        .with_for_update(skip_locked=True)
    ).all()
    resolved: list[int] = []
    for incident in candidates:
        waiting = session.execute(
            select(Decision.id, Decision.node_id).where(
                Decision.incident_id == incident.id, Decision.state.in_(("pending", "awaiting_approval"))
            )
        ).all()
        if any(node_id is not None for _, node_id in waiting):
            continue
        job = session.get_one(Job, incident.job_id)
        since = incident.updated_at + timedelta(seconds=after_s)
        if not jobs.stepped_since(session, job=job, since=since):
            continue
        if waiting:
            decision_lifecycle.expire(
                session, Decision.id.in_([i for i, _ in waiting]), message="moot: the job trains again", now=now
            )
        what = f"recovered: the job trains again ({after_s:g} s after the last evidence)"
        if resolve(session, incident=incident, resolution=what, now=now):
            resolved.append(incident.id)
    return resolved


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
    return IncidentOut.model_validate(
        Joined(
            incident,
            job_id=job_id,
            findings=[FindingOut.model_validate(Joined(f, node=node)) for f, node in rows],
            decisions=decisions.for_incident(session, incident_id=incident.id),
        )
    )


def neighbours(session: Session, *, incident_id: int) -> tuple[int | None, int | None]:
    """The nearest incident numbers below and above one that does not exist (None where there is none)."""
    before = select(func.max(Incident.id)).where(Incident.id < incident_id).scalar_subquery()
    after = select(func.min(Incident.id)).where(Incident.id > incident_id).scalar_subquery()
    row = session.execute(select(before, after)).one()
    return row[0], row[1]


def suspect_names(session: Session, *, incident_id: int) -> list[str]:
    """The names of the machines the incident accuses, most suspect first; none for an unknown id."""
    return [s["node"] for s in session.scalar(select(Incident.suspects).where(Incident.id == incident_id)) or []]


def node_states(session: Session, *, incident_id: int, suspects: Sequence[str]) -> dict[str, str]:
    """State of each node of the incident's job and of each named suspect, by name, in one query."""
    # The job by a subquery: the caller needs only the incident's id, and it costs no query of its own.
    job_id = select(Incident.job_id).where(Incident.id == incident_id).scalar_subquery()
    condition = Node.id.in_(jobs.nodes_running(job_id))
    if suspects:
        # Suspects whether or not the job still lists them: the page shows each suspect's state.
        condition = or_(condition, Node.name.in_(suspects))
    return dict(session.execute(select(Node.name, Node.state).where(condition).order_by(Node.name)).all())  # type: ignore[arg-type]


def list_incidents(
    session: Session,
    *,
    job: str | None,
    state: str | None,
    limit: int,
    cursor: str | None,
    severity: str | None = None,
    root_cause: str | None = None,
    node: str | None = None,
) -> IncidentPage:
    """Newest first, keyset-paginated on id. `state="unresolved"` means open or mitigating. `job` and `node` match
    a part of the name, as every list's name filters do: "demo" finds demo-job, "005" node-005."""
    query = select(Incident, Job.external_id).join(Job, Job.id == Incident.job_id).order_by(Incident.id.desc())
    if job:
        query = query.where(Job.external_id.icontains(job, autoescape=True))
    if node:
        suspect = func.jsonb_array_elements(Incident.suspects).table_valued("value").alias("suspect")
        named = (
            select(true())
            .select_from(suspect)
            .where(suspect.c.value.op("->>")("node").icontains(node, autoescape=True))
            .exists()
        )
        query = query.where(or_(Incident.anchor.icontains(node, autoescape=True), named))
    if state == "unresolved":
        query = query.where(Incident.state != "resolved")
    elif state:
        query = query.where(Incident.state == state)
    if severity:
        query = query.where(Incident.severity == severity)
    if root_cause:
        query = query.where(Incident.root_cause == root_cause)
    if cursor:
        query = query.where(Incident.id < decode_cursor(cursor))
    rows = session.execute(query.limit(limit + 1)).all()
    items = [IncidentOut.model_validate(Joined(i, job_id=j)) for i, j in rows[:limit]]
    return IncidentPage(items=items, next_cursor=encode_cursor(rows[limit - 1][0].id) if len(rows) > limit else None)


def open_counts(session: Session) -> dict[str, int]:
    """Unresolved incidents per severity, over all of them."""
    return dict(
        session.execute(
            select(Incident.severity, func.count()).where(Incident.state != "resolved").group_by(Incident.severity)
        ).all()
    )


def most_severe_open(session: Session, *, limit: int) -> Sequence[Row[Incident, str]]:
    """The most severe, then newest, unresolved incidents, each with its job's external id."""
    return session.execute(
        select(Incident, Job.external_id)
        .join(Job, Job.id == Incident.job_id)
        .where(Incident.state != "resolved")
        .order_by(_SEVERITY_ORDER, Incident.id.desc())
        .limit(limit)
    ).all()


def anomaly_scores(session: Session, *, now: datetime, window_s: float) -> dict[str, float]:
    """Each node's current anomaly score: how strongly an open incident accuses it, or a recent finding about it."""
    suspect = func.jsonb_array_elements(Incident.suspects).table_valued("value").alias("suspect")
    accused = session.execute(
        select(
            suspect.c.value.op("->>")("node").label("node"),
            func.max(suspect.c.value.op("->>")("confidence").cast(Float)),
        )
        .select_from(Incident)
        .join(suspect, true())
        .where(Incident.state != "resolved")
        .group_by("node")
    ).all()
    recent = session.execute(
        select(Node.name, func.max(Finding.confidence))
        .join(Node, Node.id == Finding.node_id)
        .where(Finding.created_at >= now - timedelta(seconds=window_s))
        .group_by(Node.name)
    ).all()
    scores: dict[str, float] = {}
    for name, score in [*accused, *recent]:
        if name is not None and score is not None:
            scores[name] = max(scores.get(name, 0.0), float(score))
    return scores


def of_job(session: Session, *, job: Job) -> Sequence[Incident]:
    """Every incident of the job, resolved ones included, oldest first."""
    return session.scalars(select(Incident).where(Incident.job_id == job.id).order_by(Incident.id)).all()


def machines_named(session: Session, *, job_id: str) -> list[str]:
    """The machines the job's incidents are about (their anchors and suspects), in one query: a page naming their
    GPUs needs their inventory, and an evicted machine is no longer among the job's ranks."""
    job = select(Job.id).where(Job.external_id == job_id).scalar_subquery()
    suspect = func.jsonb_array_elements(Incident.suspects).table_valued("value").alias("suspect")
    suspects = select(suspect.c.value.op("->>")("node")).select_from(Incident).join(suspect, true())
    anchors = select(Incident.anchor).where(Incident.job_id == job, Incident.anchor != "")
    named = anchors.union(suspects.where(Incident.job_id == job))
    return sorted(n for n in session.scalars(named) if n)


def naming_node(session: Session, *, name: str, limit: int) -> Sequence[Row[Incident, str]]:
    """Incidents, open or not, naming the node as a suspect or in a finding, newest first, with the job's id."""
    node_id = select(Node.id).where(Node.name == name).scalar_subquery()
    in_findings = select(Finding.incident_id).where(Finding.node_id == node_id, Finding.incident_id.is_not(None))
    return session.execute(
        select(Incident, Job.external_id)
        .join(Job, Job.id == Incident.job_id)
        .where(or_(Incident.id.in_(in_findings), Incident.suspects.contains([{"node": name}])))
        .order_by(Incident.id.desc())
        .limit(limit)
    ).all()
