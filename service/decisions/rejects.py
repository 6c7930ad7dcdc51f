"""A person's reject is remembered: a machine they cleared is not accused again on the same kind of evidence.

The demo showed why: an operator rejected "evict node-000" (its NVLink traffic unlike its peers'), and 3 s later
"evict node-000" came again on its PCIe traffic under another incident. Evidence is of the same kind when it
comes from the same detector and category, except for the detectors that compare a machine with its peers,
whose every metric says the same thing (unlike the others): there the detector alone is the kind. A suspect
whose findings are all of kinds a person rejected for it (within `policy_reject_memory_s`) gets no decision;
a finding of another kind (a Xid, an ECC error, a stack) is different evidence, and the policy decides again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ml.demarcation import IncidentProposal
from service.config import Settings
from service.models import Decision, Finding, Node

# Detectors whose findings say "this machine is unlike its peers", whichever metric shows it.
PEER_DETECTORS = frozenset({"peers", "failslow", "node_signals"})
PERSON_SCOPES = ("operator", "admin")


def evidence_kind(detector: str, category: str) -> str:
    return detector if detector in PEER_DETECTORS else f"{detector}/{category}"


def overruled(session: Session, *, proposal: IncidentProposal, now: datetime, settings: Settings) -> dict[str, str]:
    """Suspects of the proposal that a person already cleared on the same kind of evidence: node -> why."""
    suspects = {s.node: s.finding_ids for s in proposal.suspects if s.node}
    if not suspects or settings.policy_reject_memory_s <= 0:
        return {}
    since = now - timedelta(seconds=settings.policy_reject_memory_s)
    rejected: dict[str, set[str]] = defaultdict(set)
    last: dict[str, tuple[datetime, str, str | None, str | None]] = {}
    for name, kind, evidence, acked_at, actor, message in session.execute(
        select(Node.name, Decision.kind, Decision.evidence, Decision.acked_at, Decision.actor, Decision.outcome_message)
        .join(Node, Node.id == Decision.node_id)
        .where(
            Node.name.in_(suspects),
            Decision.state == "rejected",
            Decision.acked_at >= since,
            # A person's reject (an operator's or admin's), not a scheduler's refusal to act.
            or_(*(Decision.actor.startswith(f"{scope}:") for scope in PERSON_SCOPES)),
        )
        .order_by(Decision.acked_at)
    ):
        rejected[name].update(_kinds(evidence))
        last[name] = (acked_at, kind, actor, message)
    if not rejected:
        return {}
    ids = {i for node in rejected for i in suspects[node]}
    kinds_of = {
        fid: evidence_kind(detector, category)
        for fid, detector, category in session.execute(
            select(Finding.id, Finding.detector, Finding.category).where(Finding.id.in_(ids))
        )
    }
    out = {}
    for node, kinds in rejected.items():
        current = {kinds_of[i] for i in suspects[node] if i in kinds_of}
        if current and current <= kinds:
            at, kind, actor, message = last[node]
            same = ", ".join(sorted(current))
            why = f"{actor or 'a person'} rejected {kind} {node} at {at:%H:%M:%S} on the same evidence ({same})"
            out[node] = f"{why}: {message}" if message else why
    return out


def _kinds(evidence: Mapping[str, Any] | None) -> Iterable[str]:
    for f in (evidence or {}).get("findings") or ():
        if isinstance(f, Mapping) and f.get("detector") and f.get("category"):
            yield evidence_kind(str(f["detector"]), str(f["category"]))
