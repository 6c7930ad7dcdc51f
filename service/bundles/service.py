"""Evidence bundles: asked of a node's agent when a decision is about to take the node out, stored with the decision
and its incident, listed and served for download.

Stored in PostgreSQL (bytea), not in files: every API replica serves every bundle without a shared volume, a bundle
is written in the same transaction as its row (never a row without its file or a file without its row), backups of
the database hold them, and retention is a DELETE. The size cap (20 MiB by default) keeps that cheap.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.bundles.manifest import read_manifest
from service.bundles.schemas import BundleOut, BundleState
from service.config import Settings
from service.errors import Conflict, NotFound
from service.models import Decision, Directive, EvidenceBundle, Incident, Node

# The decisions after which a node may be wiped, rebooted or shipped away. A vendor replacement (RMA) is an `evict`
# at the escalation ladder's top rung (service/decisions/ladder.py), so it is one of them.
BUNDLE_KINDS = ("evict", "diagnose")
# A shadow decision is never acted on, so the node stays; a closed one has already gone.
ASKING_STATES = ("pending", "awaiting_approval")
ACTOR = "faultline bundles"


def request_for(
    session: Session, *, decisions: Iterable[Decision], now: datetime, settings: Settings
) -> list[EvidenceBundle]:
    """A `bundle` directive to the node of each evict, diagnose or RMA decision (once per decision)."""
    if not settings.bundle_enabled:
        return []
    asked: list[EvidenceBundle] = []
    deadline = now + timedelta(seconds=settings.bundle_timeout_s + settings.bundle_grace_s)
    for decision in decisions:
        if decision.kind not in BUNDLE_KINDS or decision.state not in ASKING_STATES or decision.node_id is None:
            continue
        bundle_id = uuid.uuid4()
        # The unique decision index settles two workers deciding at once: one of them asks.
        made = session.scalar(
            insert(EvidenceBundle)
            .values(
                id=bundle_id,
                decision_id=decision.id,
                incident_id=decision.incident_id,
                node_id=decision.node_id,
                state="requested",
                requested_at=now,
                deadline_at=deadline,
            )
            .on_conflict_do_nothing()
            .returning(EvidenceBundle.id)
        )
        if made is None:
            continue
        session.add(
            Directive(
                id=bundle_id,  # the agent uploads under the directive's id
                node_id=decision.node_id,
                kind="bundle",
                reason=f"{decision.kind} decision {decision.id}: {decision.reason}"[:1000],
                requested_by=ACTOR,
                created_at=now,
                expires_at=deadline,
                params={
                    "decision_id": decision.id,
                    "max_bytes": settings.bundle_max_bytes,
                    "timeout_s": settings.bundle_timeout_s,
                },
            )
        )
        asked.append(session.get_one(EvidenceBundle, bundle_id))
    session.flush()
    return asked


def store(
    session: Session, *, node: str, bundle_id: uuid.UUID, body: bytes, now: datetime, settings: Settings
) -> tuple[BundleOut, bool]:
    """Keep the agent's tar.gz for its request: (the bundle, whether it is new). The same upload twice is stored once;
    a different one for a bundle already stored is a conflict. A late upload (past the deadline) is kept all the same:
    late evidence beats none."""
    bundle = session.scalar(select(EvidenceBundle).where(EvidenceBundle.id == bundle_id).with_for_update())
    node_row = session.get(Node, bundle.node_id) if bundle is not None else None
    if bundle is None or node_row is None or node_row.name != node:
        raise NotFound(f"no bundle {bundle_id} asked of node {node!r}")
    digest = hashlib.sha256(body).hexdigest()
    if bundle.state == "stored":
        if bundle.sha256 != digest:
            raise Conflict(f"bundle {bundle_id} is already stored with other content")
        return get(session, bundle_id=bundle_id, now=now), False
    manifest = read_manifest(body)
    bundle.state = "stored"
    bundle.content = body
    bundle.size_bytes = len(body)
    bundle.sha256 = digest
    bundle.manifest = manifest
    bundle.stored_at = now
    directive = session.get(Directive, bundle_id)
    if directive is not None and directive.expires_at > now:
        directive.expires_at = now  # answered: a restarted agent must not collect it again
    session.flush()
    return get(session, bundle_id=bundle_id, now=now), True


def state_of(bundle: EvidenceBundle, now: datetime) -> BundleState:
    """Checked on read: past its deadline with nothing stored, the agent did not answer."""
    if bundle.state == "stored":
        return "stored"
    return "collecting" if now < bundle.deadline_at else "unreachable"


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


def _out(bundle: EvidenceBundle, *, node: str, decision_kind: str, decided_at: datetime, now: datetime) -> BundleOut:
    state = state_of(bundle, now)
    after = (bundle.stored_at - decided_at).total_seconds() if bundle.stored_at is not None else None
    if state == "stored":
        late = " (after its deadline)" if bundle.stored_at and bundle.stored_at > bundle.deadline_at else ""
        status = f"stored {after:.1f} s after the decision{late}, {_size(bundle.size_bytes or 0)}"
    elif state == "collecting":
        status = f"collecting: the agent has until {bundle.deadline_at:%H:%M:%S} UTC"
    else:
        status = (
            f"no bundle: agent unreachable (nothing arrived within "
            f"{(bundle.deadline_at - bundle.requested_at).total_seconds():g} s of the request)"
        )
    return BundleOut(
        id=bundle.id,
        decision_id=bundle.decision_id,
        decision_kind=decision_kind,
        incident_id=bundle.incident_id,
        node=node,
        state=state,
        status=status,
        requested_at=bundle.requested_at,
        deadline_at=bundle.deadline_at,
        stored_at=bundle.stored_at,
        seconds_after_decision=round(after, 3) if after is not None else None,
        size_bytes=bundle.size_bytes,
        sha256=bundle.sha256,
        download=f"/api/v1/bundles/{bundle.id}" if state == "stored" else None,
        manifest=bundle.manifest,
    )


def _rows(session: Session, *where: Any, limit: int | None = None) -> list[tuple[EvidenceBundle, str, str, datetime]]:
    query = (
        select(EvidenceBundle, Node.name, Decision.kind, Decision.created_at)
        .join(Node, Node.id == EvidenceBundle.node_id)
        .join(Decision, Decision.id == EvidenceBundle.decision_id)
        .where(*where)
        .order_by(EvidenceBundle.requested_at.desc(), Node.name)
        .limit(limit)
    )
    return [tuple(row) for row in session.execute(query)]  # type: ignore[misc]


def get(session: Session, *, bundle_id: uuid.UUID, now: datetime) -> BundleOut:
    rows = _rows(session, EvidenceBundle.id == bundle_id)
    if not rows:
        raise NotFound(f"no bundle {bundle_id}")
    bundle, node, kind, decided_at = rows[0]
    return _out(bundle, node=node, decision_kind=kind, decided_at=decided_at, now=now)


def for_incident(session: Session, *, incident_id: int, now: datetime, known: bool = False) -> list[BundleOut]:
    """Every bundle asked for the incident's decisions, newest first (404 for an unknown incident, unless the caller
    `known` it exists: one query, for a page that has read the incident already)."""
    if not known and session.get(Incident, incident_id) is None:
        raise NotFound(f"no incident {incident_id}")
    return [
        _out(b, node=n, decision_kind=k, decided_at=at, now=now)
        for b, n, k, at in _rows(session, EvidenceBundle.incident_id == incident_id)
    ]


def for_node(session: Session, *, node: str, now: datetime, limit: int = 20) -> list[BundleOut]:
    """The node's latest bundles, newest first (404 for an unknown node)."""
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    if node_id is None:
        raise NotFound(f"no node {node!r}")
    return [
        _out(b, node=n, decision_kind=k, decided_at=at, now=now)
        for b, n, k, at in _rows(session, EvidenceBundle.node_id == node_id, limit=limit)
    ]


def content(session: Session, *, bundle_id: uuid.UUID, now: datetime) -> tuple[bytes, str]:
    """The tar.gz and a file name for it; 404 with the reason when nothing is stored."""
    bundle = get(session, bundle_id=bundle_id, now=now)
    if bundle.state != "stored":
        raise NotFound(f"bundle {bundle_id} has no content: {bundle.status}")
    body = session.scalar(select(EvidenceBundle.content).where(EvidenceBundle.id == bundle_id))
    assert body is not None  # a stored bundle has content (ck_evidence_bundles_content)
    name = f"faultline-bundle-{bundle.node}-decision-{bundle.decision_id}.tar.gz"
    return body, name


def prune(session: Session, *, now: datetime, retention: timedelta) -> int:
    """Delete bundles asked for longer ago than `retention`; rows deleted."""
    deleted = session.execute(
        delete(EvidenceBundle).where(EvidenceBundle.requested_at < now - retention).returning(EvidenceBundle.id)
    ).all()
    session.flush()
    return len(deleted)
