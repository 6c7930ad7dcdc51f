"""What each detector puts in `Finding.evidence`, as TypedDicts, and readers that check a stored row's shape.

Evidence is stored as JSON and read back by the service and the UI, possibly rows written by an older
version. The TypedDicts say what the detectors write (plain dicts at run time, so the stored JSON is the
dict itself); the readers check a row against them once, so a page reads typed values instead of guessing,
and a malformed or older row reads as None (shown as missing), never as an exception.

Keys are optional (total=False) unless marked Required: detectors leave out what they do not know, and older
rows lack keys that later versions added. A row may also hold keys its TypedDict does not name (a newer
detector's); the readers keep them and check only the ones they know.
"""

# No `from __future__ import annotations`: the readers resolve these annotations at run time, and on Python
# 3.11 a TypedDict loses its Required keys when its annotations are strings.

import functools
from collections.abc import Mapping
from types import NoneType, UnionType
from typing import Any, Required, TypedDict, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

# A reference to a signal the finding rests on. Log events and stack dumps are cited by row id; metric and
# process signals have no row of their own and are described instead. Functional form: "from" is a keyword.
SignalRef = TypedDict(
    "SignalRef",
    {
        "type": Required[str],  # log, stack, metric, node_metric or process
        "id": int,  # the log event's or stack dump's row id
        "node": str | None,
        "gpu": int | str,  # the GPU's index (its PCI address where the index is unknown)
        "metric": str,  # a column of ml/metrics.py (or a detector's pseudo-metric: "nvlink", "last_sample")
        "ts": str | None,  # ISO time of a counter's move
        "from": str | float,  # ISO start of a span; for counters, the value before the move
        "to": str | float,  # ISO end of a span; for counters, the value after the move
        "rank": int,
        "subject": str,  # a node_metric's subject (ml/node_metrics.py): host, ib:mlx5_0/1, eth:eth0, vol:/data
        "value": float,  # a node_metric's value at `ts`
    },
    total=False,
)


class FindingEvidence(TypedDict, total=False):
    """What any detector's evidence may hold: the signals it cites (a detector this module does not know)."""

    signals: list[SignalRef]


class LogCitedEvidence(TypedDict, total=False):
    """Evidence quoting log records: the normalized signature of the claim, a few lines, counts, where."""

    signature: str
    lines: list[str]
    count: int
    nodes: list[str]
    last_at: str  # ISO: the newest record's time (its machine's return is judged against it)


class SignatureEvidence(LogCitedEvidence, total=False):
    """signatures (ml/signatures): a rule's log records and the details the rule read from them."""

    # Data-loader findings stored before the rule named its signals `exit_signals` carry them here (strings).
    signals: list[SignalRef] | list[str]
    ranks: list[int]
    # Xid, read through ml/xid.py's catalog
    xid: int
    mnemonic: str
    description: str
    immediate_action: str
    investigatory_action: str
    xid_severity: str
    gpu_reset_enough: bool  # the catalog says a reset of this one GPU clears the fault
    pci: list[str] | str  # the Xid rules list the devices; the driver-initialization rule names one
    processes: list[str]
    messages: list[str]
    # Xid 31, an illegal memory access: the other jobs (or programs) the machine had the same fault under
    repeated_elsewhere: list[str]
    caused_by_xids: list[int]  # an Xid 45 that reads as the fatal Xids it was caused by
    # NVRM failure forms (GSP timeouts, driver initialization failures)
    failures: list[str]
    gsp: bool
    driver_gpus: list[int]  # the driver's own GPU numbers ("GPU6"), not nvidia-smi's indexes
    # NVSwitch SXid
    sxid: Any  # as the record carried it (an int from faultline's parser)
    fatal: bool
    switches: list[str]
    links: list[int]
    # PCIe AER
    device: str
    aer_severity: str
    aer_errors: list[str]
    aer_type: str
    # InfiniBand and NCCL
    times: list[str]  # ISO times of distinct occurrences, latest last
    statuses: list[int]
    connections_lost: bool  # a link status (retries exceeded, no response): the job's connections are gone
    status_names: list[str]
    peers: list[str]
    peer_nodes: list[str]
    vendor_errors: list[int]
    reporters: list[str]
    nccl_codes: list[str]
    calls: list[str]  # RDMA verbs calls that failed (ibv_reg_mr, ibv_create_cq)
    errnos: list[str]  # their errno names (ENOMEM)
    ib_events: list[str]  # IB async events (IBV_EVENT_PORT_ERR)
    adapter_failed: bool  # a fatal async event (IBV_EVENT_DEVICE_FATAL): the adapter, not a flap
    module_problems: list[str]  # an adapter's port modules at fault ("module 0: Bad or shorted cable/module")
    collectives: list[int]  # flight-recorder analysis: the collectives' sequence numbers
    # collective mismatches, NCCL RAS reports (the application's: no machine accused)
    mismatch_ranks: list[int]
    shapes: list[str]
    lagging_nodes: list[str]
    ras_errors: list[str]
    ras_ranks: list[int]
    # CUDA errors, out of memory
    cuda_errors: list[str]
    fault: str  # a fault that is the application's unless its machine repeats it (illegal_memory_access)
    fault_node: str  # the machine it happened on, for the check across jobs
    widespread: bool
    tried_bytes: list[int]
    # victims' symptoms and the ranks they point at
    seqs: list[int]
    ops: list[str]
    failed_ranks: list[int]
    root_ranks: list[int]
    exit_signals: list[str]
    lagging_ranks: list[int]
    # tracebacks and crashes
    exc_type: str
    last_frame: dict[str, Any]
    reason: str
    # the learned classifier
    classifier_probability: float


class AlertEvidence(LogCitedEvidence, total=False):
    """alerts (ml/alerts.py): one node's firing Alertmanager alerts of one rule."""

    signals: list[SignalRef]
    alertname: str
    severity: str
    fingerprints: list[str]
    category_from: str  # rule or classifier
    gpus: list[str]
    summary: str
    generator_url: str
    classifier_probability: float
    alert_class: str  # "node_down" for an alert that says the whole node is gone


class CounterEvidence(TypedDict, total=False):
    """counters (ml/counters.py): GPU counters that moved, and by how much against the job's other GPUs."""

    signals: list[SignalRef]
    signature: str
    count: int
    gpus: list[int]
    counters: dict[str, int]  # uncorrectable-error column -> increase
    last_at: str  # ISO: a GPU state's newest reading (its machine's return is judged against it)
    xid: int
    mnemonic: str
    errors: int
    per_minute: float
    peer_median: float
    recoveries: int
    silent_s: float  # a lost GPU: how long it was silent while its node reported
    node_interval_s: float
    samples_since: int


class PeerWindow(TypedDict, total=False):
    """One sub-window where the GPU stood apart: its summary against its peers' median and p10-p90 band."""

    start: str
    end: str
    value: float
    z: float
    score: float
    peer_median: float
    peer_p10: float
    peer_p90: float
    n_units: int


class PeerMetric(TypedDict, total=False):
    """One metric the GPU is the outlier on, with the windows a UI plots (latest first)."""

    metric: str
    direction: str  # high or low
    score: float
    windows_flagged: int
    windows_analyzed: int
    windows: list[PeerWindow]


class PeerSupport(TypedDict, total=False):
    """A metric of the same category leaning the same way in every window without making the cut in each."""

    metric: str
    weight: float
    direction: str
    z: list[float]  # latest first


class PeerEpisode(TypedDict, total=False):
    """One stretch of spans where a recurrent straggler stood apart (ml/recurrence.py)."""

    start: str
    end: str
    metric: str
    direction: str
    z: float  # its farthest span's
    spans: int


class PeerEvidence(TypedDict, total=False):
    """peers (ml/peers.py): a GPU that stayed its peers' outlier through the continuity period, or (rule
    "recurrence", ml/recurrence.py) one that was, again and again, in separate episodes over the horizon."""

    signals: list[SignalRef]
    unit: str  # "node/gpu"
    job_id: str
    window_s: float
    continuity_s: float
    metrics: list[PeerMetric]
    supporting: list[PeerSupport]
    rule: str  # "recurrence"; absent: continuity
    horizon_s: float
    episodes: list[PeerEpisode]


class ProgressEvidence(TypedDict, total=False):
    """progress (ml/progress.py): a hang, from step records stopping or, without any, GPU activity collapsing."""

    signals: list[SignalRef]
    hang_timeout_s: float
    # from step records
    last_step: int
    last_step_at: str
    seconds_without_progress: float
    timeout_s: float  # the job's timeout, stretched for a job that logs rarely
    restarted_at: str
    gpus_computing: bool
    # from GPU activity
    metric: str
    level_before: float
    level_now: float
    collapsed_since: str
    seconds_without_activity: float
    # who is alive: ranks (process snapshots) or GPUs holding memory
    ranks_alive: int
    ranks_expected: int
    ranks_missing: list[int]
    gpus_holding_memory: int
    gpus_seen: int


class FailslowRound(TypedDict, total=False):
    """One fail-slow round: a rank's step time or CPU against its peers, or the job's step time."""

    start: str
    end: str
    ratio: float
    z: float
    rank_ms: float  # a rank's step time
    rank_cpu_pct: float  # a rank's process CPU
    step_s: float  # the job's seconds per step
    peer_median: float
    peer_p10: float
    peer_p90: float
    n_peers: int


class FailslowEvidence(TypedDict, total=False):
    """failslow (ml/failslow.py): a straggler rank (step time or CPU) or a job-level slowdown, every round."""

    signals: list[SignalRef]
    rounds: list[FailslowRound]  # latest first
    rank: int
    ratio: float
    direction: str  # CPU: high or low
    job_progressing: bool
    # the job's slowdown against its own pace
    baseline_step_s: float
    baseline_chunks: int
    source: str
    onset_step: int
    onset_at: str


class StackRequestEvidence(TypedDict, total=False):
    """stacks: what every stacks finding holds; alone, it marks a stack request that found nothing."""

    signals: list[SignalRef]
    stack_request: str  # the service's key of the stack request the finding answers


class StackGroupEvidence(TypedDict, total=False):
    """Ranks sharing one normalized stack."""

    signature: str
    state: str  # collective, data, compute, other or no_stack
    op: str
    ranks: str  # compact ranges, "0-6,8-15"
    count: int
    node_count: int
    nodes: list[str]
    frames: list[str]  # innermost first


class StackTreeNode(TypedDict, total=False):
    """A frame of the merged stack tree, with how many ranks pass through it (outermost frames at the root)."""

    name: str
    count: int
    children: list["StackTreeNode"]


class CoveringGroup(TypedDict, total=False):
    """The smallest parallel group holding the culprits, when no single machine does."""

    dim: str
    ranks: str


class StackEvidence(StackRequestEvidence, total=False):
    """stacks (ml/stacks/report.py): one snapshot's hang analysis, its groups and merged tree."""

    groups: Required[list[StackGroupEvidence]]
    tree: Required[StackTreeNode]
    signals_omitted: int
    method: str  # named, group_fallback or inconclusive
    why: str
    dominant: str | None
    dominant_state: str | None
    culprit_ranks: str
    culprit_state: str | None
    culprit_frames: list[str]  # innermost first
    covering_group: CoveringGroup | None
    ranks_reporting: int
    unreported: str


class StackRoundsEvidence(StackRequestEvidence, total=False):
    """stacks (ml/stacks/rounds.py): fail-slow rounds of stacks, the ranks apart from the rest in most."""

    rounds: Required[int]
    stragglers: Required[str]  # compact ranges
    method: str
    why: str
    informative_rounds: int
    out_counts: dict[str, int]  # rank -> rounds it stood apart in
    dominant_states: list[str | None]  # per round
    straggler_frames: list[str]
    covering_group: CoveringGroup | None


class TrainingMetricsEvidence(LogCitedEvidence, total=False):
    """training_metrics (ml/training_metrics.py): loss or grad-norm NaN or a jump, and the steps it hit."""

    signals: list[SignalRef]
    ranks: list[int]
    steps: list[int]
    first_step: int | None
    last_step: int | None
    metric: str  # loss or grad_norm
    anomaly: str  # nan or spike
    persistent: bool
    max_value: float
    factors: list[float]


Evidence = (
    SignatureEvidence
    | AlertEvidence
    | CounterEvidence
    | PeerEvidence
    | ProgressEvidence
    | FailslowEvidence
    | StackEvidence
    | StackRoundsEvidence
    | StackRequestEvidence
    | TrainingMetricsEvidence
    | FindingEvidence
)


# Detector name -> its evidence; "stacks" has three shapes (see _stacks_shape).
class NodeSignalEvidence(TypedDict, total=False):
    """node_signals (ml/node_signals.py): a port or host that stood apart from the job's other machines."""

    signals: list[SignalRef]
    rule: str  # flap, down, slow_link, errors, congestion, memory_pressure
    subject: str
    times: list[str]  # ISO times the fault was seen (the policy's flap tolerance counts them)
    flaps: int
    link_errors: int
    counters: dict[str, int]
    per_minute: float
    value: float
    peer_median: float
    peer_share: float
    unit: str
    rates: dict[str, float]  # counter -> increase per second on this machine
    peer_rates: dict[str, float]  # counter -> the peers' median increase per second
    continuity_s: float


_SHAPES: dict[str, Any] = {
    "signatures": SignatureEvidence,
    "alerts": AlertEvidence,
    "counters": CounterEvidence,
    "peers": PeerEvidence,
    "progress": ProgressEvidence,
    "failslow": FailslowEvidence,
    "training_metrics": TrainingMetricsEvidence,
    "node_signals": NodeSignalEvidence,
}


# --- readers ---


def evidence_of(detector: str, raw: object) -> Evidence | None:
    """A finding's evidence typed by its detector; None when the row does not have that detector's shape."""
    if detector == "stacks":
        return _read(raw, _stacks_shape(raw))
    return _read(raw, _SHAPES.get(detector, FindingEvidence))


def stack_evidence(raw: object) -> StackEvidence | None:
    """A stacks finding's hang analysis; None for fail-slow rounds, an empty request or a malformed row."""
    return _read(raw, StackEvidence)


def peer_evidence(raw: object) -> PeerEvidence | None:
    """A peers finding's evidence, or None."""
    return _read(raw, PeerEvidence)


def failslow_evidence(raw: object) -> FailslowEvidence | None:
    """A failslow finding's evidence, or None."""
    return _read(raw, FailslowEvidence)


def stack_tree_of(raw: object) -> StackTreeNode | None:
    """A merged stack tree, or None."""
    return _read(raw, StackTreeNode)


def signal_refs(raw: object) -> list[SignalRef]:
    """The well-formed signal references of any finding's evidence (each stands alone: a bad one is skipped)."""
    signals = raw.get("signals") if isinstance(raw, Mapping) else None
    if not isinstance(signals, list):
        return []
    return [cast(SignalRef, s) for s in signals if _fits(s, SignalRef)]


def _stacks_shape(raw: object) -> Any:
    """Which of its shapes a stacks row claims: an analysis has groups and a tree, rounds have stragglers."""
    if isinstance(raw, Mapping) and ("groups" in raw or "tree" in raw):
        return StackEvidence
    if isinstance(raw, Mapping) and ("rounds" in raw or "stragglers" in raw):
        return StackRoundsEvidence
    return StackRequestEvidence


def _read(raw: object, shape: Any) -> Any:
    """`raw` itself (extra keys and all) when it has `shape`, else None."""
    if not isinstance(raw, Mapping):
        return None
    value = raw if isinstance(raw, dict) else dict(raw)
    return value if _fits(value, shape) else None


@functools.cache
def _fields(shape: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's key types and required keys, resolved once."""
    return get_type_hints(shape), shape.__required_keys__


def _fits(value: object, shape: Any) -> bool:
    """Whether decoded JSON `value` has `shape`: a TypedDict, list[...], dict[str, ...], a union, a scalar type
    or Any. A loop rather than recursion over containers, so a deep stack tree cannot hit the recursion limit."""
    todo: list[tuple[object, Any]] = [(value, shape)]
    while todo:
        value, shape = todo.pop()
        if shape is Any:
            continue
        origin = get_origin(shape)
        if origin is list:
            if not isinstance(value, list):
                return False
            item = get_args(shape)[0]
            todo += [(v, item) for v in value]
        elif origin is dict:
            if not isinstance(value, dict):
                return False
            key, item = get_args(shape)
            todo += [(k, key) for k in value] + [(v, item) for v in value.values()]
        elif origin is UnionType or origin is Union:
            # Each member is tried whole; unions sit next to the leaves, so this nests a level or two at most.
            if not any(_fits(value, member) for member in get_args(shape)):
                return False
        elif is_typeddict(shape):
            if not isinstance(value, dict):
                return False
            hints, required = _fields(shape)
            if not required <= value.keys():
                return False
            todo += [(value[k], t) for k, t in hints.items() if k in value]
        elif not _scalar_fits(value, shape):
            return False
    return True


def _scalar_fits(value: object, shape: Any) -> bool:
    if shape is float:  # JSON has one number type: a whole float may come back from the database as an int
        return isinstance(value, int | float) and not isinstance(value, bool)
    if shape is int:  # a bool is an int to Python, never to the evidence
        return isinstance(value, int) and not isinstance(value, bool)
    if shape is NoneType:
        return value is None
    return isinstance(value, shape)
