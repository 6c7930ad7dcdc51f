"""Register and read jobs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, CompoundSelect, Row, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.jobs.schemas import JobIn, JobOut, Parallelism, PodSelector, RankOut
from service.models import FULL_PASS, DetectorState, Incident, Job, LogEvent, Node, Rank
from service.nodes import returns as node_returns
from service.nodes.service import ensure_nodes
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined


def register(session: Session, *, job_in: JobIn, now: datetime | None = None) -> Job:
    """Create the job or update it (a job first seen in agent data becomes registered). A rank map that puts ranks on
    a node faultline holds out of service places it before its return gate (service/nodes/returns.py), at `now`."""
    p = job_in.parallelism
    values = {
        "world_size": job_in.world_size,
        "tp": p.tp if p else None,
        "pp": p.pp if p else None,
        "dp": p.dp if p else None,
        "rank_order": p.order if p else None,
        "hang_timeout_s": job_in.hang_timeout_s,
        "source": "registered",
        "state": "running",  # a job id registered again (a PyTorchJob's name, reused) runs again
        "pods_namespace": job_in.pods.namespace if job_in.pods else None,
        "pods_prefix": job_in.pods.prefix if job_in.pods else None,
        "scheduler_job_id": job_in.scheduler_job_id,
    }
    stmt = insert(Job).values(external_id=job_in.job_id, **values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Job.external_id], set_={**values, "updated_at": func.now()}
    ).returning(Job.id)
    job_id = session.execute(stmt).scalar_one()
    if job_in.ranks:
        node_ids = ensure_nodes(session, names={r.node for r in job_in.ranks})
        # Where these ranks ran before: a node given ranks it did not hold is placed in the job now.
        wanted = [r.rank for r in job_in.ranks]
        before = dict(
            session.execute(select(Rank.rank, Rank.node_id).where(Rank.job_id == job_id, Rank.rank.in_(wanted))).all()
        )
        rows = [
            {
                "job_id": job_id,
                "rank": r.rank,
                "node_id": node_ids[r.node],
                "local_rank": r.local_rank,
                "gpu_index": r.gpu if r.gpu is not None else r.local_rank,
            }
            for r in sorted(job_in.ranks, key=lambda r: r.rank)
        ]
        ins = insert(Rank).values(rows)
        session.execute(
            ins.on_conflict_do_update(
                index_elements=[Rank.job_id, Rank.rank],
                set_={
                    "node_id": ins.excluded.node_id,
                    "local_rank": ins.excluded.local_rank,
                    "gpu_index": ins.excluded.gpu_index,
                    "updated_at": func.now(),
                },
            )
        )
        placed = {node_ids[r.node] for r in job_in.ranks if before.get(r.rank) != node_ids[r.node]}
        node_returns.placed_by_registration(
            session, job_id=job_id, job=job_in.job_id, placed=placed, now=now or datetime.now(UTC)
        )
    session.flush()
    return session.get_one(Job, job_id, populate_existing=True)


def end(session: Session, *, job_id: str, state: str) -> Job:
    """Mark a job finished or failed (a Slurm epilog, a launcher's exit): periodic diagnosis passes it by."""
    job = get_by_external_id(session, job_id=job_id)
    job.state = state
    session.flush()
    return job


def get_by_external_id(session: Session, *, job_id: str) -> Job:
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


def describe(session: Session, *, job: Job) -> JobOut:
    """The job with its rank-to-node map, in one query for the ranks."""
    rows = session.execute(
        select(Rank.rank, Node.name, Rank.local_rank, Rank.gpu_index, Rank.pid)
        .join(Node, Node.id == Rank.node_id)
        .where(Rank.job_id == job.id)
        .order_by(Rank.rank)
    ).all()
    ranks = [RankOut.model_validate(row) for row in rows]
    parallelism = (
        Parallelism(tp=job.tp, pp=job.pp, dp=job.dp, order=job.rank_order or "tp-dp-pp")
        if job.tp and job.pp and job.dp
        else None
    )
    pods = PodSelector(namespace=job.pods_namespace, prefix=job.pods_prefix) if job.pods_namespace else None
    nodes = sorted({r.node for r in ranks})
    return JobOut.model_validate(
        Joined(
            job,
            parallelism=parallelism,
            pods=pods,
            nodes=nodes,
            ranks=ranks,
            nvlink_domains=_nvlink_domains(session, nodes=nodes),
            diagnosed_at=session.scalar(
                select(DetectorState.cursor).where(DetectorState.job_id == job.id, DetectorState.detector == FULL_PASS)
            ),
        )
    )


def _nvlink_domains(session: Session, *, nodes: list[str]) -> dict[str, list[str]]:
    """NVLink domain -> the job's nodes in it, from the labels their heartbeats keep (service/ingest/fabric.py)."""
    if not nodes:
        return {}
    domain = Node.labels["nvlink_domain"].astext
    out: dict[str, list[str]] = {}
    for name, cluster in session.execute(
        select(Node.name, domain).where(Node.name.in_(nodes), domain.is_not(None)).order_by(Node.name)
    ):
        out.setdefault(cluster, []).append(name)
    return out


def nodes_running(job_id: int | ColumnElement[int]) -> CompoundSelect[int]:
    """The ids of the nodes running a job (its ranks', and those whose agents say they run it), as a query to embed."""
    # A query, not rows: a caller folds it into its own (incidents.node_states: one round trip, not two).
    from_ranks = select(Rank.node_id).where(Rank.job_id == job_id)
    current = select(Node.id).where(Node.current_job_id == job_id)
    return from_ranks.union(current)


def node_ids(session: Session, *, job: Job) -> list[int]:
    """Nodes running the job: from its ranks, and from nodes whose agents say they run it."""
    return sorted(set(session.scalars(nodes_running(job.id))))


def list_with_counts(
    session: Session, *, state: str | None, name: str | None, limit: int, cursor: str | None
) -> tuple[Sequence[Row[Job, int, int]], str | None]:
    """A page of jobs, newest first, with their node and open-incident counts, and the next page's cursor."""
    # The counts as subqueries: one query a page, whatever its size.
    nodes = (
        select(func.count(func.distinct(Rank.node_id))).where(Rank.job_id == Job.id).scalar_subquery().label("nodes")
    )
    open_incidents = (
        select(func.count(Incident.id))
        .where(Incident.job_id == Job.id, Incident.state != "resolved")
        .scalar_subquery()
        .label("open_incidents")
    )
    query = select(Job, nodes, open_incidents).order_by(Job.id.desc()).limit(limit + 1)
    if state:
        query = query.where(Job.state == state)
    if name:
        query = query.where(Job.external_id.icontains(name, autoescape=True))
    if cursor:
        query = query.where(Job.id < decode_cursor(cursor))
    rows = session.execute(query).all()
    return rows[:limit], encode_cursor(rows[limit - 1][0].id) if len(rows) > limit else None


def node_states(session: Session, *, job: Job) -> dict[str, tuple[str, bool]]:
    """State and lemon flag of every node running the job (from its ranks or its agents): one query."""
    in_job = select(Rank.node_id).where(Rank.job_id == job.id)
    rows = session.execute(
        select(Node.name, Node.state, Node.lemon).where((Node.id.in_(in_job)) | (Node.current_job_id == job.id))
    ).all()
    return {name: (state, lemon) for name, state, lemon in rows}


def stepped_since(session: Session, *, job: Job, since: datetime) -> bool:
    """Whether the job logged a step line stamped after `since` (its training went on)."""
    query = select(LogEvent.id).where(LogEvent.job_id == job.id, LogEvent.kind == "step", LogEvent.ts > since)
    return session.execute(query.limit(1)).first() is not None
