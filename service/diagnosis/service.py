"""Diagnose a job: detect, store findings, demarcate incidents, decide, and ask agents for stacks on a hang.

Every step is idempotent: findings are keyed, one incident per job and root cause is open at a time, one
decision per incident, kind and node. Two per-job advisory locks: one full pass at a time (a periodic pass
that finds one running skips, since the running one covers it), and one decide step at a time, which the
critical-event fast pass shares, so a Xid is decided without waiting for a 16,384-GPU metric pass (unique
constraints settle anything that slips past them). Functions flush; the task commits.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ml import demarcation
from ml.findings import Finding
from ml.peer_spans import SpanPart
from service.bundles import service as bundles
from service.checks.service import DETECTOR as CHECKS_DETECTOR
from service.config import Settings
from service.decisions import service as decisions
from service.diagnosis import metric_passes, signals, stack_requests, state, windows
from service.diagnosis.detect import JobSignals, event_detectors, run_all, run_detectors
from service.fleet import service as fleet
from service.incidents import service as incidents
from service.jobs import service as jobs
from service.models import FULL_PASS, Decision, Incident, Job, Node, Silence
from service.models import Finding as FindingRow
from service.nodes import lifecycle as node_lifecycle
from service.notify import service as notify
from service.nvlink import service as nvlink
from service.shared_causes import service as shared_causes
from service.silences import service as silences

log = logging.getLogger(__name__)

# Findings older than this no longer join open incidents.
FINDING_HORIZON = timedelta(hours=1)
# Advisory lock key spaces: "a full pass of job N runs", "job N's findings are being decided".
_PASS_LOCK = 7_401
_DECIDE_LOCK = 7_402


@dataclass(slots=True)
class DiagnosisResult:
    job_id: str
    new_findings: int = 0
    incidents: list[int] = field(default_factory=list)
    decisions: list[int] = field(default_factory=list)
    stack_requests: list[str] = field(default_factory=list)
    # When the caller should look again (a stack-dump deadline), in seconds; None: the beat is enough.
    recheck_in_s: float | None = None
    # A periodic pass that found another pass of the job running, and left the work to it.
    skipped: bool = False
    # Seconds per stage of the pass (read, rollup, each detector, write), for logs and benchmarks.
    timings: dict[str, float] = field(default_factory=dict)


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - started


def active_jobs(session: Session, *, now: datetime, active_s: float) -> list[str]:
    """Running jobs whose agents reported recently."""
    since = now - timedelta(seconds=active_s)
    return list(
        session.scalars(
            select(Job.external_id).where(Job.state == "running", Job.last_seen_at >= since).order_by(Job.id)
        )
    )


def _lock(session: Session, namespace: int, job: Job, *, wait: bool = True) -> bool:
    """A per-job advisory lock until the transaction ends (never the job row, which ingest updates)."""
    fn = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    got = session.execute(text(f"SELECT {fn}(:ns, :id)"), {"ns": namespace, "id": job.id}).scalar()
    return wait or bool(got)


def diagnose_job(
    session: Session,
    *,
    job_id: str,
    settings: Settings,
    now: datetime | None = None,
    skip_if_busy: bool = False,
    peer_parts: dict[str, list[SpanPart]] | None = None,
) -> DiagnosisResult:
    """One full pass over a job; safe to run any number of times, by any number of workers.

    `skip_if_busy` (the periodic pass) returns at once, `skipped`, when another pass of the job is running:
    queuing behind it would only repeat its work and hold a worker a fast pass may need. `peer_parts`: the peer
    comparison's per-group parts a split pass's group tasks computed (service/diagnosis/split.py)."""
    now = now or datetime.now(UTC)
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    result = DiagnosisResult(job_id=job_id)
    if job is None:
        return result
    if not _lock(session, _PASS_LOCK, job, wait=not skip_if_busy):
        result.skipped = True
        return result

    timings = result.timings
    lookback = settings.diagnosis_window_s
    with _timed(timings, "read"):
        info = signals.job_info(session, job=job)
        node_ids = jobs.node_ids(session, job=job)
        names = windows.node_names(session, node_ids=node_ids)
        since = signals.window_start(now, lookback)
        steps, events = signals.log_records(session, job=job, node_ids=node_ids, since=since, span_s=lookback)
        if not steps:
            previous = signals.last_step_before(session, job=job, before=since)
            steps = [previous] if previous else []
        processes = signals.processes_frame(session, job=job, now=now)
    with _timed(timings, "rollup"):
        # GPU metrics: the windows that closed since the last pass are built once, then read compactly.
        closed = windows.rollup(session, job=job, now=now, grace_s=settings.window_grace_s, lookback_s=lookback)
        nodes_closed = windows.rollup_nodes(
            session, job=job, now=now, grace_s=settings.node_window_grace_s, lookback_s=lookback
        )
    # The peer comparison of a large job judges windows one pass old (windows.judge_lag_s); the node signals judge
    # the node windows as they close, which is before the GPU windows do (settings.node_window_grace_s).
    gpus = info.world_size or len(info.rank_nodes or {})
    judged = windows.peers_judged(closed, now=now, gpus=gpus, settings=settings)
    with _timed(timings, "activity"):
        activity = metric_passes.job_activity(session, job=job, closed=closed, lookback_s=lookback, now=now)
    job_signals = JobSignals(
        job=info,
        steps=steps,
        events=events,
        processes=processes,
        now=now,
        activity=activity,
        processes_since=now - timedelta(seconds=signals.PROCESS_LOOKBACK_S),
    )
    found = run_all(
        job_signals,
        session=session,
        timings=timings,
        more=[
            (
                "counters",
                lambda: metric_passes.counter_findings(
                    session, job=job, info=info, closed=closed, lookback_s=lookback, names=names, now=now
                ),
            ),
            (
                "peers",
                lambda: metric_passes.peer_findings(
                    session, job=job, info=info, closed=judged, names=names, now=now, parts=peer_parts
                ),
            ),
            (
                "node_signals",
                lambda: metric_passes.node_findings(
                    session, job=job, info=info, closed=nodes_closed, lookback_s=lookback, names=names, now=now
                ),
            ),
        ],
    )
    with _timed(timings, "stacks"):
        aggregated, recheck = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=now)
    with _timed(timings, "write"):
        _lock(session, _DECIDE_LOCK, job)
        _decide(session, job=job, findings=found + aggregated, result=result, settings=settings, now=now)
        # Its own row, not the job's: ingest updates the job's row and would wait for this pass's commit.
        state.save(session, job_id=job.id, detector=FULL_PASS, version=1, cursor=now, state={}, now=now)
    waits = [w for w in (recheck, result.recheck_in_s) if w is not None]
    result.recheck_in_s = min(waits) if waits else None
    return result


def diagnose_events(
    session: Session, *, job_id: str, settings: Settings, now: datetime | None = None
) -> DiagnosisResult:
    """The fast pass a critical event (a fatal Xid, a crash) triggers: the job's recent log events only,
    their detectors, then the same decide step as a full pass. Its cost depends on the events, not on the
    job's size, and it waits for no metric pass, only for another pass's decide step."""
    now = now or datetime.now(UTC)
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    result = DiagnosisResult(job_id=job_id)
    if job is None:
        return result
    timings = result.timings
    with _timed(timings, "read"):
        info = signals.job_info(session, job=job)
        node_ids = jobs.node_ids(session, job=job)
        since = signals.window_start(now, settings.diagnosis_window_s)
        events = signals.event_records(session, job=job, node_ids=node_ids, since=since)
    found = run_detectors(event_detectors(info, events), session=session, job_id=job_id, timings=timings)
    with _timed(timings, "write"):
        _lock(session, _DECIDE_LOCK, job)
        _decide(session, job=job, findings=found, result=result, settings=settings, now=now)
    return result


def _decide(
    session: Session, *, job: Job, findings: list[Finding], result: DiagnosisResult, settings: Settings, now: datetime
) -> None:
    """Store the pass's findings, group the open ones into incidents, decide, and ask for stacks."""
    returned = node_lifecycle.returned_at(session, names={f.node for f in findings if f.node})
    findings = [f for f in findings if not _before_return(f, returned)]
    fresh = store_findings(session, job=job, findings=findings, now=now)
    result.new_findings = len(fresh)
    # A failing NVLink domain (GB200 NVL72) is decided for the whole domain, before its trays' NVLink findings
    # could be decided one tray at a time (they are then explained by the domain's shared incident).
    nvlink.check_nodes(
        session,
        node_names={f.node for f in findings if f.node and f.category in nvlink.CATEGORIES},
        now=now,
        settings=settings,
    )
    if fresh:
        # Findings on several nodes that share a switch, rack, driver or mount: one shared incident decides for the
        # component (its members cordoned), before the nodes are decided one by one (service/shared_causes/).
        result.decisions += [d.id for d in shared_causes.detect_and_decide(session, now=now, settings=settings)]

    open_findings, checked = _without_check_results(_open_findings(session, job=job, now=now))
    open_findings = _late_to_their_incidents(session, job=job, open_findings=open_findings, now=now)
    open_findings = _since_their_return(session, job=job, open_findings=open_findings, current=findings)
    # What the open shared incidents explain, read once for the pass: its findings and its suspects.
    spans = shared_causes.explained_members(session, now=now)
    open_findings = _not_shared(session, job=job, open_findings=open_findings, spans=spans)
    open_findings = _nvlink_settled(session, open_findings=open_findings, now=now, settings=settings)
    proposals = demarcation.demarcate(
        [(fid, f) for fid, f, _ in open_findings], earlier_faults=_earlier_faults(session, job=job, now=now)
    )
    applied = incidents.apply_proposals(session, job=job, proposals=proposals, fresh=fresh, now=now)
    for incident in applied.incidents:
        if incident.id in checked:
            incident.blame = "infrastructure"  # its machine failed its checks, whatever the first evidence said
    result.incidents = [i.id for i in applied.incidents]
    active_silences = silences.active_silences(session, now=now) if proposals else []
    # The nodes every incident may mark, locked at once in name order (see nodes.lifecycle.lock): one lock per
    # incident would take them in incident order and deadlock with a maintenance pass resolving others.
    node_lifecycle.lock(session, names=(s.node for p in proposals for s in p.suspects if s.node))
    for incident, proposal in zip(applied.incidents, proposals, strict=True):
        result.decisions += _act(
            session,
            job=job,
            incident=incident,
            proposal=proposal,
            opened=incident.id in applied.created,
            active_silences=active_silences,
            spans=spans,
            now=now,
            settings=settings,
        )
    # By when the finding was observed, on the pass's clock as stack requests are (not the row's insertion time: on a
    # clock hours ahead of the database's, every pass asked again).
    asked, ask_recheck = stack_requests.ask(
        session, job=job, findings=[(f, f.observed_at) for _, f, _ in open_findings], settings=settings, now=now
    )
    result.stack_requests = [str(d.id) for d in asked]
    result.recheck_in_s = ask_recheck


def _nvlink_settled(
    session: Session, *, open_findings: list[tuple[int, Finding, FindingRow]], now: datetime, settings: Settings
) -> list[tuple[int, Finding, FindingRow]]:
    """Without the NVLink findings of NVLink-domain trays still settling (service/nvlink/service.py `settling`):
    they open an incident a few seconds later, or never, when their domain's incident explains them."""
    loose = [(f.node, f.category, row.created_at) for _, f, row in open_findings if f.node and row.incident_id is None]
    held = nvlink.settling(session, findings=loose, now=now, settings=settings)
    if not held:
        return open_findings
    return [
        (fid, f, row)
        for fid, f, row in open_findings
        if row.incident_id is not None or f.category != "nvlink" or f.node not in held
    ]


def _act(
    session: Session,
    *,
    job: Job,
    incident: Incident,
    proposal: demarcation.IncidentProposal,
    opened: bool,
    active_silences: list[Silence],
    spans: list[shared_causes.Explained],
    now: datetime,
    settings: Settings,
) -> list[int]:
    """Decide an incident and tell people, unless a maintenance window covers it; mark its suspects."""
    # A suspect whose finding a shared incident explains (its switch is down) gets no decision of its own, and is not
    # accused: the component is to blame. Its evidence of another category (its own Xid) is another incident.
    explained = {
        s.node
        for s in proposal.suspects
        if s.node
        and shared_causes.is_explained(spans, node=s.node, category=proposal.root_cause, observed_at=now, evidence=None)
    }
    suspects = [s.node for s in proposal.suspects if s.node and s.node not in explained]
    if explained and not suspects:
        return []
    job_silence = silences.covering(active_silences, job=job.external_id, nodes=())
    node_silences = silences.covered_nodes(active_silences, nodes=suspects, job=job.external_id)
    if job_silence is not None or (suspects and set(suspects) <= set(node_silences)):
        # Findings stay for the record; nothing is decided, announced or held against the nodes.
        incident.silence_id = job_silence.id if job_silence else node_silences[suspects[0]]
        return []
    if opened or incident.silence_id is not None:
        # New, or its maintenance window just ended: people hear of it now (once: events are keyed).
        incident.silence_id = None
        notify.record_incident_event(session, incident=incident, event="opened", now=now)
    made = decisions.decide_incident(
        session,
        job=job,
        incident=incident,
        proposal=proposal,
        now=now,
        settings=settings,
        skip_nodes=set(node_silences) | set(explained),
    )
    if made:
        notify.record_incident_event(session, incident=incident, event="decided", decisions=made, now=now)
        # Before the node leaves (wiped, rebooted, shipped): its agent collects an evidence bundle.
        bundles.request_for(session, decisions=made, now=now, settings=settings)
    accused = [
        s.node
        for s in proposal.suspects
        if s.node
        and s.node not in node_silences
        and s.node not in explained
        and s.confidence >= settings.policy_diagnose_min_confidence
    ]
    if accused and proposal.blame != "user_code":
        node_lifecycle.mark_suspects(session, incident=incident, names=accused, now=now, settings=settings)
    return [d.id for d in made]


def finding_key(job: Job, finding: Finding) -> str:
    """The dedup key: a detector's own key, else a digest of what it claims."""
    own = (
        finding.key
        or hashlib.sha256(
            f"{finding.category}|{finding.subject_kind}|{finding.subject}|{finding.summary}".encode()
        ).hexdigest()[:24]
    )
    return f"{job.id}:{finding.detector}:{own}"[:500]


def store_findings(session: Session, *, job: Job, findings: list[Finding], now: datetime) -> set[int]:
    """Insert findings not stored yet (by key), and move each open series row to its pass's finding.

    Returns the ids of the rows that are new evidence: inserted, or a series row whose claim moved."""
    if not findings:
        return set()
    node_ids = dict(
        session.execute(select(Node.name, Node.id).where(Node.name.in_({f.node for f in findings if f.node}))).all()
    )
    rows = {}
    for f in findings:
        key = finding_key(job, f)
        rows[key] = {
            "dedup_key": key,
            "job_id": job.id,
            "node_id": node_ids.get(f.node) if f.node else None,
            "detector": f.detector,
            "category": f.category,
            "subject_kind": f.subject_kind if f.subject_kind in ("job", "node", "gpu", "rank") else "job",
            "subject": f.subject[:500],
            "confidence": float(min(max(f.confidence, 0.0), 1.0)),
            "summary": f.summary[:1000],
            "blame": f.blame,
            "role": f.role,
            "action": f.action,
            "evidence": f.evidence,
            "observed_at": f.observed_at,
            "series_key": f"{job.id}:{f.detector}:{f.series}"[:500] if f.series else None,
            "last_seen_at": f.seen_until or f.observed_at if f.series else None,
        }
    fresh = _update_series(session, job=job, rows=rows, now=now)
    if rows:
        fresh.update(
            session.scalars(
                insert(FindingRow)
                .values(list(rows.values()))
                .on_conflict_do_nothing(index_elements=["dedup_key"])
                .returning(FindingRow.id)
            ).all()
        )
    return fresh


def _update_series(session: Session, *, job: Job, rows: dict[str, dict[str, Any]], now: datetime) -> set[int]:
    """A pass's finding of a series with an open row is taken out of `rows`; when its evidence goes past the
    row's last (the counter rose again), it updates that row: claim, evidence, last seen. A series whose row is
    in a resolved incident starts a new row (a new fault). The window sliding over old evidence moves nothing."""
    series = {r["series_key"]: key for key, r in rows.items() if r["series_key"]}
    if not series:
        return set()
    stored = set(session.scalars(select(FindingRow.dedup_key).where(FindingRow.dedup_key.in_(rows))))
    open_rows = session.scalars(
        select(FindingRow)
        .outerjoin(Incident, Incident.id == FindingRow.incident_id)
        .where(
            FindingRow.job_id == job.id,
            FindingRow.series_key.in_(series),
            FindingRow.created_at >= now - FINDING_HORIZON,
            (FindingRow.incident_id.is_(None)) | (Incident.state != "resolved"),
        )
        .order_by(FindingRow.id.desc())
        .with_for_update(of=FindingRow)
    ).all()
    updated: set[int] = set()
    seen: set[str] = set()
    for row in open_rows:
        if row.series_key in seen:
            continue  # an older row of the series (stored before series existed): the newest carries it on
        seen.add(row.series_key)
        key = series[row.series_key]
        values = rows.pop(key)
        if key in stored or values["last_seen_at"] <= (row.last_seen_at or row.observed_at):
            continue
        for column in ("dedup_key", "node_id", "subject_kind", "subject", "confidence", "summary", "action"):
            setattr(row, column, values[column])
        row.evidence = values["evidence"]
        row.last_seen_at = values["last_seen_at"]
        updated.add(row.id)
    return updated


def _earlier_faults(session: Session, *, job: Job, now: datetime) -> list[Finding]:
    """The job's recent machine faults whose incidents are resolved: their victims' peer findings still come."""
    rows = session.execute(
        select(FindingRow, Node.name)
        .join(Node, Node.id == FindingRow.node_id)
        .join(Incident, Incident.id == FindingRow.incident_id)
        .where(
            FindingRow.job_id == job.id,
            Incident.state == "resolved",
            FindingRow.observed_at >= now - FINDING_HORIZON - demarcation.VICTIM_AFTER,
            FindingRow.role == "cause",
            FindingRow.detector != "peers",  # never a hard fault; node_signals' port rules are (hard_fault below)
        )
        .order_by(FindingRow.id.desc())
        .limit(200)
    ).all()
    faults = [f for f in (row.to_ml(node) for row, node in rows) if demarcation.hard_fault(f)]
    # A machine evicted for its fault and put back in the job after its repair: its fault's wake ended there.
    back = decisions.rejoined_after_eviction(session, nodes={f.node for f in faults if f.node})
    # Up to VICTIM_SLACK after the eviction's ack: the counters' rise sampled as the machine left, read a pass later
    # (the 200-fault campaign: 0.3 s after it), is the old fault's too; out of the job, it shows nothing newer.
    return [f for f in faults if not (f.node in back and f.observed_at <= back[f.node][0] + demarcation.VICTIM_SLACK)]


def _late_to_their_incidents(
    session: Session, *, job: Job, open_findings: list[tuple[int, Finding, FindingRow]], now: datetime
) -> list[tuple[int, Finding, FindingRow]]:
    """Late evidence of a machine's fault already dealt with joins its resolved incident (which stays resolved); the
    rest of the open findings go on to demarcation.

    A resolved incident dealt with the machine it is about (its anchor) and with every machine its evictions and GPU
    resets took out (a job-wide incident too: a NaN loss whose diagnose checks failed and evicted the node, whose
    failing check results arrive as findings of their own); one that took no machine out dealt with the job's
    cause (a NaN run the relaunched job got over, read again by a later pass)."""
    rows = session.execute(
        select(Incident.id, Incident.anchor, Incident.root_cause, Incident.opened_at, Incident.resolved_at).where(
            Incident.job_id == job.id,
            Incident.state == "resolved",
            Incident.resolved_at >= now - FINDING_HORIZON,
        )
    ).all()
    if not rows:
        return open_findings
    ids = [r.id for r in rows]
    first = fleet.first_evidence(session, incident_ids=ids)
    acted = session.execute(
        select(Decision.incident_id, Decision.kind, Decision.acked_at, Node.name)
        .join(Node, Node.id == Decision.node_id)
        .where(
            Decision.incident_id.in_(ids),
            Decision.state == "done",
            Decision.kind.in_(("evict", "reset_gpu", "diagnose")),
        )
    ).all()
    machines: dict[int, set[str]] = {r.id: {r.anchor} - {""} for r in rows}
    left: dict[int, datetime] = {}  # when the incident's machine first left the job (drained or evicted)
    for incident_id, kind, acked_at, node in acted:
        if kind != "diagnose":
            machines[incident_id].add(node)
        if acked_at is not None:
            left[incident_id] = min(acked_at, left.get(incident_id, acked_at))
    dealt = [
        demarcation.Dealt(
            r.id, node, first.get(r.id, r.opened_at), r.resolved_at, r.root_cause, left.get(r.id, r.resolved_at)
        )
        for r in rows
        if r.resolved_at is not None
        for node in sorted(machines[r.id]) or [""]
    ]
    late = demarcation.late_evidence([(fid, f) for fid, f, _ in open_findings], dealt)
    for row_id, incident_id in late.items():
        session.execute(update(FindingRow).where(FindingRow.id == row_id).values(incident_id=incident_id))
    return [item for item in open_findings if item[0] not in late]


def _latest_evidence(finding: Finding) -> datetime:
    """The newest moment a finding's evidence names: its observation, a series' last sighting, its occurrences, its
    newest log record."""
    latest = max(finding.observed_at, finding.seen_until or finding.observed_at)
    times = finding.evidence.get("times")
    last = finding.evidence.get("last_at")
    for item in [*(times if isinstance(times, list) else []), *([last] if last else [])]:
        try:
            at = datetime.fromisoformat(str(item))
        except ValueError:
            continue
        if at.tzinfo is not None and at > latest:
            latest = at
    return latest


def _before_return(finding: Finding, returned: dict[str, datetime]) -> bool:
    """Evidence all of it from before its machine came back into service: the machine before its repair (the calm
    campaign evicted a node again 11 s after its return gate passed, on a row-remap failure reading stamped before its
    return, its memory replaced)."""
    return finding.node in returned and _latest_evidence(finding) < returned[finding.node]


def _since_their_return(
    session: Session, *, job: Job, open_findings: list[tuple[int, Finding, FindingRow]], current: list[Finding]
) -> list[tuple[int, Finding, FindingRow]]:
    """Open findings without those from before their machine's return, unless this pass found their claim again
    with newer evidence (a row of the same key, stored while the machine was out, that a fault after its return
    repeats)."""
    returned = node_lifecycle.returned_at(session, names={f.node for _, f, _ in open_findings if f.node})
    if not returned:
        return open_findings
    again = {finding_key(job, f) for f in current}
    return [item for item in open_findings if item[2].dedup_key in again or not _before_return(item[1], returned)]


def _not_shared(
    session: Session,
    *,
    job: Job,
    open_findings: list[tuple[int, Finding, FindingRow]],
    spans: list[shared_causes.Explained],
) -> list[tuple[int, Finding, FindingRow]]:
    """The open findings less those a shared incident explains (a member's IB errors behind a failed switch, the
    job's victims of it): the component is their incident, not the job (service/shared_causes/)."""
    if not spans:
        return open_findings
    job_nodes = set(windows.node_names(session, node_ids=jobs.node_ids(session, job=job)).values())
    return [
        item
        for item in open_findings
        if not shared_causes.is_explained(
            spans,
            node=item[1].node,
            category=item[1].category,
            observed_at=item[1].observed_at,
            evidence=item[1].evidence,
            job_nodes=job_nodes,
        )
    ]


def _without_check_results(
    open_findings: list[tuple[int, Finding, FindingRow]],
) -> tuple[list[tuple[int, Finding, FindingRow]], set[int]]:
    """The open findings less the failed stop-time checks a diagnose decision's incident already holds (they are
    that incident's evidence: regrouped by machine they would open a second incident for the same fault), and
    the ids of the incidents that hold some."""
    rest: list[tuple[int, Finding, FindingRow]] = []
    checked: set[int] = set()
    for item in open_findings:
        row = item[2]
        if row.detector == CHECKS_DETECTOR and row.incident_id is not None:
            checked.add(row.incident_id)
        else:
            rest.append(item)
    return rest, checked


def _open_findings(session: Session, *, job: Job, now: datetime) -> list[tuple[int, Finding, FindingRow]]:
    """Recent findings not yet in a resolved incident, back in the detectors' shape."""
    rows = session.execute(
        select(FindingRow, Node.name)
        .outerjoin(Node, Node.id == FindingRow.node_id)
        .outerjoin(Incident, Incident.id == FindingRow.incident_id)
        .where(
            FindingRow.job_id == job.id,
            FindingRow.created_at >= now - FINDING_HORIZON,
            (FindingRow.incident_id.is_(None)) | (Incident.state != "resolved"),
        )
        .order_by(FindingRow.id)
    ).all()
    return [(row.id, row.to_ml(node), row) for row, node in rows]
