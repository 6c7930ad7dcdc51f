"""The contract between detectors and the service: plain inputs (a job, its signals) and findings out.

Everything here is plain data. The service loads signals from its database into these shapes; a laptop can
build them from a CSV. Detectors are functions `detect(...) -> list[Finding]` and never raise on odd input:
they skip what they cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# The evidence each detector writes, and the readers that check a stored row, live in ml/evidence.py.
from ml.evidence import (
    AlertEvidence,
    CounterEvidence,
    CoveringGroup,
    Evidence,
    FailslowEvidence,
    FailslowRound,
    FindingEvidence,
    LogCitedEvidence,
    NodeSignalEvidence,
    PeerEvidence,
    PeerMetric,
    PeerSupport,
    PeerWindow,
    ProgressEvidence,
    SignalRef,
    SignatureEvidence,
    StackEvidence,
    StackGroupEvidence,
    StackRequestEvidence,
    StackRoundsEvidence,
    StackTreeNode,
    TrainingMetricsEvidence,
    evidence_of,
    failslow_evidence,
    peer_evidence,
    signal_refs,
    stack_evidence,
    stack_tree_of,
)

__all__ = [
    "ACTIONS",
    "BLAMES",
    "CATEGORIES",
    "ROLES",
    "SUBJECT_KINDS",
    "AlertEvidence",
    "CounterEvidence",
    "CoveringGroup",
    "Evidence",
    "FailslowEvidence",
    "FailslowRound",
    "Finding",
    "FindingEvidence",
    "JobInfo",
    "LogCitedEvidence",
    "LogRecord",
    "NodeSignalEvidence",
    "PeerEvidence",
    "PeerMetric",
    "PeerSupport",
    "PeerWindow",
    "ProgressEvidence",
    "SignalRef",
    "SignatureEvidence",
    "StackEvidence",
    "StackGroupEvidence",
    "StackRequestEvidence",
    "StackRoundsEvidence",
    "StackSample",
    "StackTreeNode",
    "TrainingMetricsEvidence",
    "evidence_of",
    "failslow_evidence",
    "peer_evidence",
    "signal_refs",
    "stack_evidence",
    "stack_tree_of",
]

# Root-cause categories, most specific first: an incident's root cause is one of these.
CATEGORIES = (
    "gpu_hardware",  # fatal Xid, GPU fallen off the bus, uncorrectable ECC, row-remap failure
    "nvlink",  # NVLink errors (Xid 74, CRC/replay counters)
    "pcie",  # PCIe AER, replay counters
    "network",  # IB completion errors, NCCL network failures, link flaps, congested or degraded ports
    "host",  # the machine itself: under pressure (memory, CPU, I/O), or its memory failing (EDAC)
    "hang",  # no progress while processes live; localized by stack aggregation
    "straggler",  # fail-slow: one machine slower than its peers
    "oom",  # out of memory (GPU or host)
    "storage",  # filesystem / I/O errors
    "user_code",  # the same exception on every rank, Python errors in the training code
    "nan",  # loss or grad norm NaN or a 5x jump
    "job_failure",  # victims' symptoms (watchdog timeouts, peers' NCCL errors) with no cause found yet
    "unknown",
)
BLAMES = ("infrastructure", "user_code", "unknown")
SUBJECT_KINDS = ("job", "node", "gpu", "rank")
# A cause explains an incident; a symptom (a victim's watchdog timeout) only corroborates one.
ROLES = ("cause", "symptom")
# What a finding's detector would do about it on its own; the service's policy has the last word.
ACTIONS = ("evict", "diagnose", "restart", "rollback", "none")


@dataclass(frozen=True, slots=True)
class Finding:
    """One detector's claim about a subject, with confidence and references to its evidence."""

    detector: str  # "signatures", "counters", "log_classifier", "peers", "progress", "stacks", "failslow", ...
    category: str  # one of CATEGORIES
    subject_kind: str  # one of SUBJECT_KINDS
    subject: str  # node name, "node/gpu", "rank 5", or the job's external id
    confidence: float  # 0..1, calibrated where the detector can be
    summary: str  # one line a person reads first: "Xid 79 (GPU fallen off the bus) on node-003 GPU 5"
    observed_at: datetime  # when the evidence happened (the signal's time, not the detector's)
    node: str | None = None  # the machine this finding points at; None for job-level claims
    blame: str = "unknown"  # one of BLAMES
    role: str = "cause"  # one of ROLES
    action: str = "none"  # one of ACTIONS
    # Stable identity: the same claim about the same evidence gets the same key on every run, so a
    # re-run stores nothing new. The service prefixes the job and detector.
    key: str = ""
    # An ongoing claim's identity without its moment (a counter that keeps climbing: its node and signature):
    # each pass's finding of one series updates the one open row of it rather than adding a row. "" for none.
    series: str = ""
    # A series finding's latest evidence (the counter's last rise): a pass moves the series row only past it.
    seen_until: datetime | None = None
    # JSON-able: {"signals": [{"type": "log"|"metric"|"stack"|"process", "id": ..., ...}], plus detector details},
    # shaped as the detector's TypedDict in ml/evidence.py (a Mapping, so that a TypedDict is accepted).
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as the detectors see it: size, parallelism and where each rank runs."""

    job_id: str
    world_size: int | None = None
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    order: str = "tp-dp-pp"  # fastest- to slowest-varying dimension along the global rank (Megatron)
    hang_timeout_s: float = 600.0
    rank_nodes: Mapping[int, str] = field(default_factory=dict)  # global rank -> node name

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.rank_nodes.values()))


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A parsed log event as the agent shipped it (`kind`, `fields` as in agents/parsers)."""

    id: int
    ts: datetime
    node: str
    kind: str
    line: str
    severity: str | None = None
    rank: int | None = None
    source: str | None = None  # "kmsg" or "training"
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StackSample:
    """One rank's py-spy dump: `threads` as `py-spy dump --json` prints them (each with a `frames` list)."""

    rank: int
    node: str
    pid: int
    threads: list[dict[str, Any]]
    id: int | None = None
    ts: datetime | None = None


# Metric samples travel as a pandas DataFrame with columns ts (UTC), node, gpu and one column per metric
# named as in ml/metrics.py (gpu_util, sm_clock, power_usage, ...). Counters (ecc_*, nvlink_*_errors,
# *_bytes, total_energy, ...) are cumulative: detectors difference them.
# Process snapshots: a DataFrame with ts, node, rank, pid, cpu_pct, rss_bytes, state.
