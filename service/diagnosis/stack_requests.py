"""Stacks on the service's own initiative: one request on a suspected hang, rounds on a job-wide slowdown.

A hang request is aggregated once every rank answered or its deadline passed. Where its stacks name a machine,
a second look some seconds later must name it again before it is accused: a hang persists, while a rank caught
in a loader hiccup just as a long checkpoint ends is training again by then. A fail-slow campaign is
several requests a few seconds apart (ByteRobust: the straggler is the rank outside the collective round
after round), aggregated after its last round. Each aggregation is stored under a key naming its request or
campaign, which is how a later pass knows it is done.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ml import stacks
from ml.findings import Finding, JobInfo, StackSample
from service.config import Settings
from service.diagnosis import signals
from service.directives.service import request_stack_dump
from service.jobs import service as jobs
from service.models import Directive, Job, StackDump
from service.models import Finding as FindingRow

log = logging.getLogger(__name__)

HORIZON = timedelta(hours=1)
# A step stamped up to this long before a hang's stack request already ends the stall (see _stall_over).
STALL_OVER_S = 20.0
# Launchers' closing signals this long before a stack request still explain a rank found without a stack.
LAUNCHER_STOP_SLACK = timedelta(seconds=30)
# A dump's process counts as the stalled job's when the agents reported it this long before the request.
RESTARTED_LOOKBACK = timedelta(minutes=10)
CAMPAIGN_COOLDOWN = timedelta(minutes=10)


def ask(
    session: Session, *, job: Job, findings: Sequence[tuple[Finding, datetime]], settings: Settings, now: datetime
) -> tuple[list[Directive], float | None]:
    """Requests to make now: for a new job-level hang, or a new job-level slowdown. (requests, recheck in s)."""
    made: list[Directive] = []
    recheck: float | None = None
    hang = _newest(findings, "hang")
    if hang is not None and not _asked_since(session, job=job, purpose="hang", since=hang[1]):
        made.append(
            _hang_request(session, job=job, reason=f"suspected hang: {hang[0].summary}", settings=settings, now=now)
        )
        recheck = settings.stack_dump_deadline_s
        log.info("job %s: suspected hang, asked agents for stacks", job.external_id)
    slow = _newest(findings, "straggler")
    # One campaign per slowdown, and at most one per cooldown however the slowdown findings come and go.
    since = min(slow[1], now - CAMPAIGN_COOLDOWN) if slow else now
    if slow is not None and not _asked_since(session, job=job, purpose="failslow", since=since):
        made.append(request_round(session, job=job, campaign_id=uuid.uuid4(), round=1, settings=settings, now=now))
        recheck = min(recheck or settings.failslow_round_s, settings.failslow_round_s)
        log.info("job %s: job-wide slowdown, starting %d stack rounds", job.external_id, settings.failslow_rounds)
    return made, recheck


def _hang_request(
    session: Session,
    *,
    job: Job,
    reason: str,
    settings: Settings,
    now: datetime,
    first: Directive | None = None,
    named: Sequence[str] = (),
) -> Directive:
    """A hang's stack request; `first`: the look this one confirms (its id ties the two), which `named` machines."""
    return request_stack_dump(
        session,
        job=job,
        requested_by="faultline",
        reason=reason[:500],
        ttl_s=int(settings.stack_dump_deadline_s + 30),
        purpose="hang",
        round=2 if first else None,
        campaign_id=first.id if first else None,
        params={"named": list(named)} if first else None,
        now=now,
    )


def request_round(
    session: Session, *, job: Job, campaign_id: uuid.UUID, round: int, settings: Settings, now: datetime
) -> Directive:
    of = settings.failslow_rounds
    planned = f"round {round} of {of}" if round <= of else f"extra round {round} (up to {_max_rounds(settings)})"
    return request_stack_dump(
        session,
        job=job,
        requested_by="faultline",
        reason=f"fail-slow localization, {planned}",
        ttl_s=int(settings.failslow_round_s + settings.stack_dump_deadline_s),
        purpose="failslow",
        round=round,
        campaign_id=campaign_id,
        now=now,
    )


def next_round(session: Session, *, job: Job, settings: Settings, now: datetime) -> float | None:
    """Issue the next round of any campaign whose last round is one interval old; seconds until the next look."""
    rows = session.execute(
        select(Directive.campaign_id, func.max(Directive.round), func.max(Directive.created_at))
        .where(Directive.job_id == job.id, Directive.purpose == "failslow", Directive.created_at >= now - HORIZON)
        .group_by(Directive.campaign_id)
    ).all()
    waits: list[float] = []
    for campaign_id, last_round, last_at in rows:
        if last_round >= settings.failslow_rounds:
            continue
        due = last_at + timedelta(seconds=settings.failslow_round_s)
        if now >= due:
            request_round(session, job=job, campaign_id=campaign_id, round=last_round + 1, settings=settings, now=now)
            waits.append(settings.failslow_round_s)
        else:
            waits.append((due - now).total_seconds())
    return min(waits) if waits else None


def aggregate(
    session: Session, *, job: Job, info: JobInfo, settings: Settings, now: datetime
) -> tuple[list[Finding], float | None]:
    """Findings from requests that are complete or past their deadline; and when to look again, if ever."""
    out, waits = _aggregate_hangs(session, job=job, info=info, settings=settings, now=now)
    # Rounds due now are asked before the campaigns are read, so a campaign sees its newest round.
    next_wait = next_round(session, job=job, settings=settings, now=now)
    if next_wait is not None:
        waits.append(next_wait)
    found, campaign_waits = _advance_campaigns(session, job=job, info=info, settings=settings, now=now)
    waits += campaign_waits
    return out + found, (min(waits) if waits else None)


def _aggregate_hangs(
    session: Session, *, job: Job, info: JobInfo, settings: Settings, now: datetime
) -> tuple[list[Finding], list[float]]:
    """One snapshot's findings per hang request that is complete or past its deadline; (findings, waits). A first
    look naming machines asks for a confirming one instead, whose findings keep only the machines both named."""
    waits: list[float] = []
    ready: list[Directive] = []
    hangs = session.scalars(
        select(Directive).where(
            Directive.job_id == job.id, Directive.purpose == "hang", Directive.created_at >= now - HORIZON
        )
    ).all()
    by_id = {d.id: d for d in hangs}
    looked_again = {d.campaign_id for d in hangs if d.campaign_id is not None}
    for directive in hangs:
        if directive.id in looked_again or _done(session, job=job, key=str(directive.id)):
            continue
        wait = _pending(session, directive, info=info, settings=settings, now=now)
        if wait is not None:
            waits.append(wait)
        else:
            ready.append(directive)

    def asked(directive: Directive) -> datetime:
        """When the stall was asked about: a confirming look's first look (if still within the horizon)."""
        first = by_id.get(directive.campaign_id) if directive.campaign_id is not None else None
        return (first or directive).created_at

    samples_of = signals.stack_samples_for(session, directive_ids=[d.id for d in ready])
    stopped = (
        signals.stopped_by_launcher(
            session, job=job, since=min(asked(d) for d in ready) - LAUNCHER_STOP_SLACK, until=now
        )
        if ready
        else set()
    )
    out: list[Finding] = []
    for directive in ready:
        if _stall_over(session, job=job, info=info, asked=asked(directive)):
            # The job trained on after the request (a long checkpoint, not a hang): its stacks are of a running
            # job, caught at whatever phase each machine was in, and say nothing about a stall.
            continue
        # A rank without a stack because its launcher stopped it (the job torn down meanwhile) accuses no one.
        samples = [s for s in samples_of[directive.id] if s.threads or (s.node, s.pid) not in stopped]
        samples = _of_the_stalled_processes(session, job=job, samples=samples, asked=asked(directive))
        analysis = stacks.analyze(info, samples) if samples else None
        found = stacks.findings(info, analysis, observed_at=_when(samples, now)) if analysis else []
        named = sorted({f.node for f in found if f.node})
        key, n = str(directive.id), len(samples)
        if named and directive.campaign_id is None:
            due = directive.created_at + timedelta(seconds=settings.hang_confirm_s)
            if now < due:
                waits.append((due - now).total_seconds())
                continue
            who = ", ".join(named)
            _hang_request(
                session,
                job=job,
                reason=f"confirming a hang: first look named {who}",
                settings=settings,
                now=now,
                first=directive,
                named=named,
            )
            waits.append(settings.stack_dump_deadline_s)
            log.info("job %s: hang stacks name %s, looking again to confirm", job.external_id, who)
            out += _keyed([_holding(found[0], job, n=n, who=who)], key, job, now, what="hang", n=n)
            continue
        summary = None
        if directive.campaign_id is not None:
            before = set((directive.params or {}).get("named", []))
            kept = [f for f in found if f.node is None or f.node in before]
            if named and not kept:
                summary = f"a second look at the stall named {', '.join(named)}, not the first look's machines"
            found = kept
        out += _keyed(found, key, job, now, what="hang", n=n, summary=summary)
    return out, waits


def _of_the_stalled_processes(
    session: Session, *, job: Job, samples: list[StackSample], asked: datetime
) -> list[StackSample]:
    """The samples of processes that were running when the stall was asked about. The job restarted meanwhile (a
    spare swapped in) has new processes, still loading its checkpoint when dumped: their stacks say nothing about
    the stall, and a rank still reading its data accused its machine. Kept whole where no process was reported
    (an agent that sees no processes)."""
    before = signals.processes_before(session, job=job, since=asked - RESTARTED_LOOKBACK, until=asked)
    if not before:
        return samples
    return [s for s in samples if (s.node, s.pid) in before]


def _stall_over(session: Session, *, job: Job, info: JobInfo, asked: datetime) -> bool:
    """Whether the job stepped again after a hang's stack request. The request comes a hang timeout after the
    last step, so a step stamped later than half of it (at most STALL_OVER_S) before the request is a new one,
    whichever way a node's clock is off by a few seconds."""
    margin = timedelta(seconds=min(STALL_OVER_S, info.hang_timeout_s / 2))
    return jobs.stepped_since(session, job=job, since=asked - margin)


def _advance_campaigns(
    session: Session, *, job: Job, info: JobInfo, settings: Settings, now: datetime
) -> tuple[list[Finding], list[float]]:
    """Each fail-slow campaign whose planned rounds are in: its findings, or one more round while it is
    unsettled; (findings, waits)."""
    waits: list[float] = []
    ready: list[tuple[uuid.UUID, list[Directive]]] = []
    for campaign_id, rounds in _campaigns(session, job=job, now=now).items():
        if _done(session, job=job, key=str(campaign_id)) or len(rounds) < settings.failslow_rounds:
            continue
        wait = _pending(session, rounds[-1], info=info, settings=settings, now=now)
        if wait is not None:
            waits.append(wait)
        else:
            ready.append((campaign_id, rounds))
    samples_of = signals.stack_samples_for(session, directive_ids=[d.id for _, rounds in ready for d in rounds])
    out: list[Finding] = []
    for campaign_id, rounds in ready:
        last = rounds[-1]
        samples = [s for s in (samples_of[d.id] for d in rounds) if s]
        looks = len(rounds) - settings.failslow_rounds + 1
        result = stacks.analyze_rounds(info, samples, looks=looks) if samples else None
        if result is not None and result.leading and not result.stragglers and len(rounds) < _max_rounds(settings):
            due = last.created_at + timedelta(seconds=settings.failslow_round_s)
            if now >= due:
                request_round(
                    session, job=job, campaign_id=campaign_id, round=len(rounds) + 1, settings=settings, now=now
                )
                log.info("job %s: stack rounds not settled after %d, one more", job.external_id, len(rounds))
            waits.append(settings.failslow_round_s if now >= due else (due - now).total_seconds())
            continue
        observed = _when([s for r in samples for s in r], now)
        found = stacks.round_findings(info, result, observed_at=observed) if result else []
        out += _keyed(found, str(campaign_id), job, now, what="straggler", n=len(samples))
    return out, waits


def _pending(
    session: Session, directive: Directive, *, info: JobInfo, settings: Settings, now: datetime
) -> float | None:
    """Seconds to wait for a request that not every rank answered yet and whose deadline has not passed."""
    expected = len(info.rank_nodes) or (info.world_size or 0)
    deadline = directive.created_at + timedelta(seconds=settings.stack_dump_deadline_s)
    if _answered(session, [directive]) < expected and now < deadline:
        return (deadline - now).total_seconds()
    return None


def _max_rounds(settings: Settings) -> int:
    return max(settings.failslow_rounds, settings.failslow_max_rounds)


def _campaigns(session: Session, *, job: Job, now: datetime) -> dict[uuid.UUID, list[Directive]]:
    rows = session.scalars(
        select(Directive)
        .where(Directive.job_id == job.id, Directive.purpose == "failslow", Directive.created_at >= now - HORIZON)
        .order_by(Directive.round)
    ).all()
    out: dict[uuid.UUID, list[Directive]] = {}
    for d in rows:
        if d.campaign_id is not None:
            out.setdefault(d.campaign_id, []).append(d)
    return out


def _holding(named: Finding, job: Job, *, n: int, who: str) -> Finding:
    """A first look's record while its second look is out: the first look's stacks, accusing no one yet."""
    return replace(
        named,
        subject_kind="job",
        subject=job.external_id,
        node=None,
        confidence=0.3,
        summary=f"stacks of {n} ranks name {who}; looking again to confirm (a hang persists)",
        blame="unknown",
        role="symptom",
        action="none",
        key="first-look",
        evidence={**named.evidence, "why": f"first look: {named.evidence.get('why', '')}"},
    )


def _keyed(
    found: list[Finding], key: str, job: Job, now: datetime, *, what: str, n: int, summary: str | None = None
) -> list[Finding]:
    """Key every finding by its request, so the aggregation is stored once; a no-result marker otherwise, saying
    `summary` if given."""
    if not found:
        summary = summary or (
            f"stacks of {n} ranks show no outlier" if n else "no agent returned stacks in time (is py-spy installed?)"
        )
        found = [
            Finding(
                detector="stacks",
                category=what,
                subject_kind="job",
                subject=job.external_id,
                confidence=0.3,
                summary=summary,
                observed_at=now,
                role="symptom",
            )
        ]
    return [
        replace(f, detector="stacks", key=f"{key}:{f.key or f.subject}", evidence={**f.evidence, "stack_request": key})
        for f in found
    ]


def _done(session: Session, *, job: Job, key: str) -> bool:
    """Whether a finding keyed by this request exists (the service prefixes keys with job and detector)."""
    prefix = f"{job.id}:stacks:{key}:"
    return session.scalar(select(FindingRow.id).where(FindingRow.dedup_key.startswith(prefix)).limit(1)) is not None


def _answered(session: Session, directives: Sequence[Directive]) -> int:
    ids = [str(d.id) for d in directives]
    return session.scalar(select(func.count(func.distinct(StackDump.rank))).where(StackDump.directive_id.in_(ids))) or 0


def _asked_since(session: Session, *, job: Job, purpose: str, since: datetime) -> bool:
    return (
        session.scalar(
            select(Directive.id)
            .where(Directive.job_id == job.id, Directive.purpose == purpose, Directive.created_at >= since)
            .limit(1)
        )
        is not None
    )


def _newest(findings: Sequence[tuple[Finding, datetime]], category: str) -> tuple[Finding, datetime] | None:
    """The newest job-level finding of a category asking for diagnosis (what stacks would localize)."""
    job_level = [(f, at) for f, at in findings if f.category == category and f.node is None and f.action == "diagnose"]
    return max(job_level, key=lambda x: x[1]) if job_level else None


def _when(samples: Sequence[object], now: datetime) -> datetime:
    times = [s.ts for s in samples if getattr(s, "ts", None)]  # type: ignore[attr-defined]
    return max(times) if times else now
