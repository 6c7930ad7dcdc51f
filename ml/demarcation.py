"""Demarcation: a job's findings grouped into incidents, each with a root cause, a blame and ranked suspects.

One incident per fault: a machine's own fault (a GPU, a link, its host) is an incident of its own, by root cause
and machine, so two machines failing one after another in a long-running job are two incidents, each decided
and resolved on its own; a job-wide cause (a hang or a slowdown being localized, a user's bug) is one incident
per root cause. Symptoms (victims' watchdog timeouts, peers' NCCL errors, torchrun's summary)
never open an incident while a cause explains them; a job-level hang or slowdown is folded into an
infrastructure incident that already names a machine, because a machine that lost a GPU also stalls the job,
and so is a stall pinned on a machine for which such a cause is already named.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ml.findings import CATEGORIES, Finding
from ml.node_metrics import PAUSE_TX_FRAMES
from ml.peer_spans import THROUGHPUT_METRICS, overheated, working_harder

# Categories a job-level stall can be the consequence of: these absorb hang/straggler/job_failure findings.
_EXPLAINS_STALLS = frozenset({"gpu_hardware", "nvlink", "pcie", "network", "host"})
_STALLS = frozenset({"hang", "straggler", "job_failure"})
# Job-level findings a machine's fault leaves when it stops the job: no progress, launchers reporting dead ranks.
_JOB_STOPS = frozenset({"hang", "job_failure"})
# Job-level findings that a localizer (stacks, peers) turns into a machine.
_LOCALIZED = frozenset({"hang", "straggler"})
# A claim that "this machine is unlike its peers" (peers; node_signals' congestion and memory pressure) can be a
# victim's: a fault elsewhere in the job (a link down, a GPU lost, the job restarted around it) changes what its
# peers do to it. node_signals' rules that read the machine's own ports (a flap, a port down, a link trained
# slower, its error counters climbing) are direct evidence, as a Xid is, whatever fault came before elsewhere.
_DIRECT_NODE_RULES = frozenset({"flap", "down", "slow_link", "errors"})
# A machine unlike its peers from shortly after another machine's hard fault until this long after it is that
# fault's victim (its traffic fell with the link it talks over; it restarted later or sooner than the others).
VICTIM_AFTER = timedelta(minutes=15)
VICTIM_SLACK = timedelta(seconds=30)  # windows and clocks: a victim's first window may start just before
_SEVERITY = {
    "gpu_hardware": "critical",
    "nvlink": "major",
    "pcie": "minor",
    "network": "major",
    "host": "major",
    "hang": "critical",
    "straggler": "major",
    "oom": "major",
    "storage": "major",
    "user_code": "major",
    "nan": "major",
    "job_failure": "major",
    "unknown": "minor",
}


@dataclass(frozen=True, slots=True)
class Suspect:
    node: str
    confidence: float
    action: str  # the strongest action a finding about this node asks for
    finding_ids: tuple[int, ...]
    reason: str  # the strongest finding's summary
    # The one GPU (its PCI address, as Xid lines name it) whose reset the catalog says clears every finding
    # asking to take this node out; None when any of them needs the node (or names no single GPU).
    reset_gpu: str | None = None


@dataclass(slots=True)
class IncidentProposal:
    root_cause: str
    blame: str
    confidence: float
    severity: str
    summary: str
    finding_ids: list[int] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    # The strongest job-level action asked for (rollback for a user bug, diagnose for a hang, ...).
    job_action: str = "none"
    # The machine a machine fault's incident is about; "" for a job-wide incident.
    anchor: str = ""


_ACTION_RANK = {"none": 0, "restart": 1, "diagnose": 2, "rollback": 3, "evict": 4}


def localizing(root_cause: str, suspects: Sequence[object]) -> bool:
    """Whether an open incident is still being localized: a stall or a failure of the job whose evidence does
    not yet separate a machine. People read "localizing", not a list of every node."""
    return root_cause in (*_LOCALIZED, "job_failure") and not suspects


def incident_confidence(suspects: Sequence[Suspect], confidences: Sequence[float], blame: str) -> float:
    """An incident's one confidence, the figure shown wherever the incident is: its top suspect's when it names
    machines (so the header never disagrees with its suspect), else its strongest finding's. A user-code incident
    keeps its strongest finding's: the job-level action (rollback) reads it, and no machine is blamed."""
    if suspects and blame != "user_code":
        return max(s.confidence for s in suspects)
    return max(confidences, default=0.0)


def _noisy_or(confidences: Sequence[float]) -> float:
    """Independent pieces of evidence about one node add up, without ever reaching certainty."""
    miss = 1.0
    for c in confidences:
        miss *= 1.0 - min(max(c, 0.0), 0.999)
    return 1.0 - miss


def _sides(f: Finding) -> list[tuple[str, str]]:
    """(metric, direction) of each metric a peers finding names."""
    metrics = f.evidence.get("metrics")
    listed = metrics if isinstance(metrics, list) else []
    return [(str(m.get("metric")), str(m.get("direction"))) for m in listed if isinstance(m, dict)]


def peer_comparison(f: Finding) -> bool:
    """A finding that says a machine stands out from its peers in a way another machine's fault can make it do (not
    a port's own counters, not a GPU running hotter than its peers, not one busier than its peers: another machine's
    fault makes its peers wait, idle, never work longer each step; the demo's straggler on node-002 was taken for
    the victim of node-005's port errors and never decided)."""
    if f.detector == "node_signals":
        return f.evidence.get("rule") not in _DIRECT_NODE_RULES and not sends_pauses(f)
    sides = _sides(f)
    return f.detector == "peers" and not overheated(sides) and not working_harder(sides)


def sends_pauses(f: Finding) -> bool:
    """Congestion whose machine sends PFC pause frames far above its peers': its own NIC cannot take what it is
    sent (its host or PCIe side). Another machine's fault makes peers wait to send, and a pause storm spreads as
    pauses received, never as pauses sent. The 200-fault campaign took such a machine, minutes after another
    machine's eviction, for that fault's victim four times, and nobody acted until it was drained by hand."""
    rates = f.evidence.get("rates")
    return f.evidence.get("rule") == "congestion" and isinstance(rates, dict) and PAUSE_TX_FRAMES in rates


def hard_fault(f: Finding) -> bool:
    """A machine's own fault, seen directly (a Xid, an error counter, a port flap), not by comparing it with peers."""
    return (
        f.role == "cause"
        and f.node is not None
        and not peer_comparison(f)
        and f.category in _EXPLAINS_STALLS
        and f.action in ("evict", "diagnose")
    )


def _victim_of(f: Finding, faults: Sequence[Finding], dealt: Sequence[Finding]) -> Finding | None:
    """The hard fault on another machine that explains a peer comparison's finding about this one, if any: a fault
    still open (the job stalls or runs degraded around it), or one already dealt with when the finding is about the
    data the machine moved (the job restarted around the fault and its traffic shifted). A GPU less busy or slower
    than its peers long after the faulty machine left is no longer that fault's doing (the campaign's runaway
    loaders, each minutes after another machine's eviction, were all taken for its victims)."""
    if not peer_comparison(f) or f.role != "cause" or f.node is None:
        return None
    if any(fault.node == f.node for fault in [*faults, *dealt]):
        return None  # a machine with a fault of its own is no victim
    sides = _sides(f)
    moved_data = f.detector != "peers" or (bool(sides) and all(metric in THROUGHPUT_METRICS for metric, _ in sides))
    explaining = [*faults, *dealt] if moved_data else faults
    return next((fault for fault in explaining if _in_wake(fault, f.observed_at)), None)


# What a GPU that failed does to its own links and to the ranks on it: PCIe replays, NVLink errors, a CUDA error
# of unknown cause in one rank (a GSP timeout kills its kernels with launch_failure). On the failed GPU (or, where
# the findings do not say which GPU, its node), from its failure on, they are the failure's symptoms.
_GPU_CONSEQUENCES = ("pcie", "nvlink", "unknown")


def _gpus(f: Finding) -> set[int] | None:
    """The GPU indexes a finding names, or None where it names none by index (a Xid names a PCI address)."""
    listed = f.evidence.get("gpus") if isinstance(f.evidence, dict) else None
    if isinstance(listed, list) and listed and all(isinstance(g, int) for g in listed):
        return set(listed)
    _, _, tail = f.subject.partition("/")
    return {int(tail)} if f.subject_kind == "gpu" and tail.isdigit() else None


def _fold_gpu_consequences(
    by_category: dict[str, list[tuple[int, Finding]]], earlier_faults: Sequence[Finding] = ()
) -> None:
    """A link error on a GPU that had already failed joins the failure's incident as its symptom; after a failure
    already dealt with (in `earlier_faults`), while in its wake, it is in no incident (the failure's was resolved)."""
    failed = [f for _, f in by_category.get("gpu_hardware", ()) if f.node and f.role == "cause"]
    dealt = [f for f in earlier_faults if f.category == "gpu_hardware" and f.node]
    if not failed and not dealt:
        return

    def on_failed_gpu(f: Finding, g: Finding) -> bool:
        gpus = _gpus(f)
        return (
            g.node == f.node
            and f.observed_at >= g.observed_at - VICTIM_SLACK
            and (gpus is None or (other := _gpus(g)) is None or bool(gpus & other))
        )

    for category in _GPU_CONSEQUENCES:
        for fid, f in list(by_category.get(category, ())):
            if any(on_failed_gpu(f, g) for g in failed):
                by_category[category].remove((fid, f))
                by_category["gpu_hardware"].append((fid, replace(f, role="symptom")))
            elif any(on_failed_gpu(f, g) and _in_wake(g, f.observed_at) for g in dealt):
                by_category[category].remove((fid, f))
        if category in by_category and not by_category[category]:
            del by_category[category]


def _passing_spikes(items: Sequence[tuple[int, Finding]]) -> bool:
    """Only job-wide loss or grad-norm jumps that ask for nothing: healthy training has them (the 200-fault
    campaign opened an incident, a notification, for each of four on healthy stretches), so they open none. They
    stay findings on the job's page and join a NaN's incident; a NaN, a jump that asks for a rollback, or one on
    a single machine opens one."""
    return all(f.node is None and f.action == "none" and f.evidence.get("anomaly") == "spike" for _, f in items)


def _aftermath(symptom: Finding, current: Sequence[Finding], earlier_faults: Sequence[Finding]) -> bool:
    """A symptom (a launcher's failure summary) from the restart after an earlier fault, which was dealt with,
    before any of the current causes began: it belongs to that fault, not to the next one."""
    causes = [f.observed_at for f in current if f.role == "cause"]
    if causes and symptom.observed_at >= min(causes) - VICTIM_SLACK:
        return False
    return any(_in_wake(fault, symptom.observed_at) for fault in earlier_faults if hard_fault(fault))


def _in_wake(fault: Finding, when: datetime) -> bool:
    """Whether a moment falls in a fault's wake: from (just before) it until VICTIM_AFTER after its last sign."""
    return fault.observed_at - VICTIM_SLACK <= when <= (fault.seen_until or fault.observed_at) + VICTIM_AFTER


@dataclass(frozen=True, slots=True)
class Dealt:
    """An incident already resolved: a machine fault's (its node evicted, its GPU reset, or closed by a person), or
    a job-wide one's (node "": a NaN loss or a user's bug the relaunched job got over)."""

    incident_id: int
    node: str
    since: datetime  # its first evidence
    until: datetime  # when it was resolved
    root_cause: str = ""
    left: datetime | None = None  # when its machine left the job (drained for checks, evicted), if before `until`


def late_evidence(findings: Sequence[tuple[int, Finding]], dealt: Sequence[Dealt]) -> dict[int, int]:
    """Finding id -> the resolved incident it belongs to: a finding about a machine observed while that machine's
    fault was being dealt with, which reached a pass only after (a metric counter's rise is read a pass after the
    Xid line that got the node evicted). Opening a new incident with it would accuse the machine again once it is
    back from repair. A user's bug is the job's, never one machine's late evidence. Job-level ones below: a stall
    that began before a dealt machine left the job, and a job-wide cause read again after its incident resolved."""
    late: dict[int, int] = {}
    newest_first = sorted(dealt, key=lambda d: d.until, reverse=True)
    for fid, f in findings:
        if f.node and f.category == "user_code":
            continue
        if f.node:
            owner = next(
                (
                    d
                    for d in newest_first
                    if d.node == f.node and d.since - VICTIM_AFTER <= f.observed_at <= d.until + VICTIM_SLACK
                ),
                None,
            )
        elif f.category in _JOB_STOPS:
            # The job's stall or failure that began while a machine's fault stopped it (its hang timeout runs out
            # during the restart on a spare; a launcher reports the dead rank) is that fault's, once it is dealt
            # with. A stall that began after the machine left the job (the job restarted without it and stalled
            # again, while its checks ran) is new. A launcher's failure summary reports whatever stopped the job, a
            # job-wide cause too (every rank crashed on a user's bug): stored a pass after that incident resolved,
            # it opened one of its own, of unknown blame, in the 200-fault campaign.
            began = onset(f)
            owner = next(
                (
                    d
                    for d in newest_first
                    if (d.node or f.category == "job_failure")
                    and d.since - VICTIM_SLACK <= began <= (d.left or d.until) + VICTIM_SLACK
                ),
                None,
            )
        else:
            # The job-wide cause the relaunched job got over, read again from the steps logged before it was (a NaN
            # run's later steps reach a pass after the incident resolved): that incident's, not a second one.
            owner = next(
                (
                    d
                    for d in newest_first
                    if not d.node and d.root_cause == f.category and d.since - VICTIM_SLACK <= f.observed_at <= d.until
                ),
                None,
            )
        if owner is not None:
            late[fid] = owner.incident_id
    return late


def onset(f: Finding) -> datetime:
    """When what a finding reports began: a stall's last step, its restart or the collapse of GPU activity, not
    when its timeout ran out; the observation itself for the rest."""
    for key in ("restarted_at", "last_step_at", "collapsed_since"):
        value = f.evidence.get(key)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                continue
    return f.observed_at


def demarcate(
    findings: Sequence[tuple[int, Finding]], *, earlier_faults: Sequence[Finding] = ()
) -> list[IncidentProposal]:
    """Group (finding id, finding) pairs of one job into incident proposals, most severe first.

    A peer comparison's finding about a machine that starts while another machine has a hard fault (among the
    findings, or in `earlier_faults`: the job's recent ones already dealt with, for a finding about the data moved)
    is that fault's victim, not a second cause: a symptom of the fault's incident when it is open, and no incident
    when it is not (see _victim_of)."""
    faults = [f for _, f in findings if hard_fault(f)]
    dealt = [f for f in earlier_faults if hard_fault(f)]
    by_category: dict[str, list[tuple[int, Finding]]] = defaultdict(list)
    symptoms: list[tuple[int, Finding]] = []
    # (category, machine) of the fault -> its victims
    victims: dict[tuple[str, str], list[tuple[int, Finding]]] = defaultdict(list)
    for fid, finding in findings:
        fault = _victim_of(finding, faults, dealt)
        if fault is not None:
            victims[(fault.category, fault.node or "")].append((fid, replace(finding, role="symptom")))
        elif finding.role == "symptom":
            symptoms.append((fid, finding))
        else:
            category = finding.category if finding.category in CATEGORIES else "unknown"
            by_category[category].append((fid, finding))

    _fold_gpu_consequences(by_category, earlier_faults)
    if _passing_spikes(by_category.get("nan", ())):
        by_category.pop("nan", None)
    symptoms = [(fid, f) for fid, f in symptoms if not _aftermath(f, [f for _, f in findings], earlier_faults)]

    # A node-naming infrastructure cause explains the job's stall: fold job-level stall findings into it.
    explaining = [c for c in by_category if c in _EXPLAINS_STALLS and any(f.node for _, f in by_category[c])]
    if explaining:
        host = max(explaining, key=lambda c: max(f.confidence for _, f in by_category[c]))
        for stall in _STALLS & by_category.keys():
            job_level = [(i, f) for i, f in by_category[stall] if f.node is None]
            if job_level:
                by_category[host].extend(job_level)
                by_category[stall] = [(i, f) for i, f in by_category[stall] if f.node is not None]
                if not by_category[stall]:
                    del by_category[stall]

    # A machine that stalls or lags for a cause already named on it (its port flapping, its host out of memory)
    # is one incident: the stall is that cause's consequence, not a second root cause.
    for stall in _STALLS & by_category.keys():
        for fid, f in list(by_category[stall]):
            causes = [c for c in explaining if f.node and any(g.node == f.node for _, g in by_category[c])]
            if causes:
                host = max(causes, key=lambda c: max(g.confidence for _, g in by_category[c] if g.node == f.node))
                by_category[host].append((fid, f))
                by_category[stall].remove((fid, f))
        if not by_category[stall]:
            del by_category[stall]

    proposals = [_proposal(category, items, anchor) for category, anchor, items in _per_fault(by_category)]
    for proposal in proposals:
        # Victims corroborate their fault's open incident; a fault already dealt with leaves them in none.
        proposal.finding_ids.extend(fid for fid, _ in victims.get((proposal.root_cause, proposal.anchor), ()))
    if symptoms:
        if proposals:
            # Victims' symptoms corroborate the most severe cause rather than open their own incident.
            proposals.sort(key=_rank)
            proposals[0].finding_ids.extend(fid for fid, _ in symptoms)
        else:
            proposals.append(_proposal("job_failure", symptoms))
    proposals.sort(key=_rank)
    return proposals


def _per_fault(
    by_category: dict[str, list[tuple[int, Finding]]],
) -> list[tuple[str, str, list[tuple[int, Finding]]]]:
    """(root cause, machine, findings) per incident: a machine fault's findings by machine, the job-level ones
    folded into its category (the job stalls because of it) with the machine its strongest evidence names; a
    job-wide cause whole."""
    groups: list[tuple[str, str, list[tuple[int, Finding]]]] = []
    for category, items in by_category.items():
        by_node: dict[str, list[tuple[int, Finding]]] = defaultdict(list)
        for fid, f in items:
            if f.node:
                by_node[f.node].append((fid, f))
        if category not in _EXPLAINS_STALLS or not by_node:
            groups.append((category, "", items))
            continue
        job_level = [(fid, f) for fid, f in items if not f.node]
        if job_level:
            lead = max(
                by_node,
                key=lambda n: (
                    max(f.confidence for _, f in by_node[n]),
                    -min(f.observed_at for _, f in by_node[n]).timestamp(),
                    n,
                ),
            )
            by_node[lead].extend(job_level)
        groups.extend((category, node, its) for node, its in sorted(by_node.items()))
    return groups


def _rank(p: IncidentProposal) -> tuple[int, float]:
    order = {"critical": 0, "major": 1, "minor": 2}
    return (order.get(p.severity, 3), -p.confidence)


def _proposal(category: str, items: list[tuple[int, Finding]], anchor: str = "") -> IncidentProposal:
    by_node: dict[str, list[Finding]] = defaultdict(list)
    ids_by_node: dict[str, list[int]] = defaultdict(list)
    for fid, f in items:
        if f.node:
            by_node[f.node].append(f)
            ids_by_node[f.node].append(fid)
    suspects = []
    for node, node_findings in by_node.items():
        strongest = max(node_findings, key=lambda f: (_ACTION_RANK.get(f.action, 0), f.confidence))
        suspects.append(
            Suspect(
                node=node,
                confidence=round(_noisy_or([f.confidence for f in node_findings]), 4),
                action=strongest.action,
                finding_ids=tuple(ids_by_node[node]),
                reason=strongest.summary,
                reset_gpu=_resettable_gpu(node_findings),
            )
        )
    suspects.sort(key=lambda s: (-s.confidence, s.node))
    job_level = [f for _, f in items if not f.node]
    causes = [f.confidence for f in job_level if f.role == "cause"]
    if category in _LOCALIZED and len(suspects) == 1 and causes:
        # The job-level finding says some machine stalls or lags; localization names the only candidate.
        # Together they say more than the localization alone, but the job-level half counts only half.
        only = suspects[0]
        boosted = round(_noisy_or([only.confidence, 0.5 * max(causes)]), 4)
        suspects = [replace(only, confidence=boosted)]
    job_action = max((f.action for f in job_level), key=lambda a: _ACTION_RANK.get(a, 0), default="none")
    blame = _blame(category, [f for _, f in items])
    confidence = incident_confidence(suspects, [f.confidence for _, f in items], blame)
    lead = max(items, key=lambda x: x[1].confidence)[1]
    summary = f"{category.replace('_', ' ')}: {lead.summary}"
    if len(suspects) > 1:
        summary += f" (+{len(suspects) - 1} more node{'s' if len(suspects) > 2 else ''})"
    return IncidentProposal(
        root_cause=category,
        blame=blame,
        confidence=round(confidence, 4),
        severity=_SEVERITY.get(category, "major"),
        summary=summary[:500],
        finding_ids=[fid for fid, _ in items],
        suspects=suspects,
        job_action=job_action,
        anchor=anchor,
    )


def _resettable_gpu(node_findings: Sequence[Finding]) -> str | None:
    """The single GPU (its PCI address) a reset would clear, when every finding asking to evict the node says so
    of that GPU.

    Stalls folded into the incident (the job hangs because the GPU failed) are the fault's consequence, not
    a second reason to take the node out. DCGM's Xid counter names the GPU by index, not address: it agrees
    when it reports a reset-enough code on one GPU index only (the kernel line gives the address).
    """
    evicting = [f for f in node_findings if f.action == "evict" and f.category not in _STALLS]
    gpus: set[str] = set()
    indexes: set[int] = set()
    for f in evicting:
        pci = f.evidence.get("pci")
        if f.subject_kind != "gpu" or not f.evidence.get("gpu_reset_enough"):
            return None
        if pci:
            gpus.update([pci] if isinstance(pci, str) else pci)
        else:
            indexes.update(f.evidence.get("gpus") or [-1])
    return next(iter(gpus)) if len(gpus) == 1 and len(indexes) <= 1 else None


def _blame(category: str, findings: list[Finding]) -> str:
    """The most confident finding's blame, unless the category settles it."""
    if category in ("gpu_hardware", "nvlink", "pcie", "network"):
        return "infrastructure"
    if category == "user_code":
        return "user_code"
    votes: dict[str, float] = defaultdict(float)
    for f in findings:
        votes[f.blame] += f.confidence
    known = {b: v for b, v in votes.items() if b != "unknown"}
    return max(known, key=lambda b: known[b]) if known else "unknown"
