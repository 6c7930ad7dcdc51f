"""Plumbing the rule families share: records read as occurrences, evidence, findings, grouping, and the
vocabularies more than one family reads."""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from ml.findings import Finding, JobInfo, LogRecord, SignatureEvidence
from ml.normalize import signature

DETECTOR = "signatures"
MAX_SIGNALS = 50  # record references kept per finding
MAX_LINES = 3  # raw lines quoted per finding
LINE_CHARS = 500  # characters quoted per line
MAX_LIST = 64  # ranks, nodes, times listed per finding
BURST_S = 1.0  # occurrences closer than this are one (an IB error's Recv and Send lines)
MIN_CLASSIFIER_P = 0.5  # the learned classifier's lower bound for a finding

Classify = Callable[[list[str]], list[tuple[str, float]]]

# The name the package had as one module, so that logging configuration and filters still match.
_log = logging.getLogger("ml.signatures")

# --- vocabularies shared by several families ---------------------------------------------------------

# "Transport endpoint is not connected" (ENOTCONN) is a socket's error: a peer went away (c10d's store, Gloo, a process
# dying next to a GPU fault). Only with a path after it is it a FUSE mount whose daemon died.
_STORAGE_INFRA = re.compile(
    r"(?i)Input/output error|\bEIO\b|\[Errno 5\]|Read-only file system|\bEROFS\b|\[Errno 30\]"
    r"|Transport endpoint is not connected:\s*['\"]?/|Remote I/O error|\[Errno 121\]"
    r"|LustreError|\blustre\b.{0,40}(?:error|fail)|nfs: server \S+ not responding|\bNFS\b.{0,40}(?:error|fail)"
    r"|\bGPFS\b.{0,40}(?:error|fail)|mmfs.{0,20}error"
)
# A handle of a shared file system whose file was replaced or removed under it (another process or node deleted it;
# the server failed over): the job's files or the file system's, rarely the machine that saw it.
_STORAGE_STALE = re.compile(r"(?i)Stale file handle|\bESTALE\b|\[Errno 116\]|\bNFS\b.{0,40}stale")
_STORAGE_CAPACITY = re.compile(
    r"(?i)No space left on device|\bENOSPC\b|\[Errno 28\]|Disk quota exceeded|\bEDQUOT\b|\[Errno 122\]"
)
_STORAGE_SHM = re.compile(r"(?i)/dev/shm|</torch_|shared memory|\bshm\b")  # /dev/shm full, not a file system
_OBJECT_STORE = re.compile(r"Unable to connect to endpoint|Could not connect to the endpoint URL")
# The parser's storage_error categories, as the storage rule groups them.
_STORAGE_CATEGORIES = {
    "io": "io",
    "read_only": "io",
    "stale": "stale",
    "capacity": "capacity",
    "shm": "shm",
    "object_store": "object_store",
}
_HARDWARE_WORDS = re.compile(
    r"(?i)uncorrectable ECC|double bit error|fallen off the bus|\bXid\b|NVLink (?:error|fatal)|GPU is lost"
    r"|Unable to determine the device handle|GPU requires reset|nvidia-smi has failed|RmInitAdapter failed"
)


def storage_kind(text: str) -> str | None:
    """What a filesystem or object-store error says, from its words: io, stale, capacity, shm or object_store."""
    if _STORAGE_STALE.search(text):
        return "stale"
    if _STORAGE_INFRA.search(text):
        return "io"
    if _STORAGE_CAPACITY.search(text):
        return "shm" if _STORAGE_SHM.search(text) else "capacity"
    if _OBJECT_STORE.search(text):
        return "object_store"
    return None


# --- plumbing -----------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Occ:
    """One error read from one record: a record may carry two (a NCCL error and the IB error it wraps)."""

    record: LogRecord
    kind: str
    fields: Mapping[str, Any]
    rank: int | None
    node: str
    via: str | None = None  # the block kind it was unwrapped from (traceback, crash, child_failed)

    @property
    def ts(self) -> datetime:
        return self.record.ts


@dataclass(slots=True)
class _Job:
    """The job as the rules need it: ranks, nodes and name lookups."""

    info: JobInfo
    world: int
    nodes: list[str]
    short: dict[str, str] = field(default_factory=dict)  # short host name -> node
    hosts: tuple[str, ...] = ()  # the node names, for normalize()

    def node_of_rank(self, rank: int | None) -> str | None:
        if rank is None:
            return None
        return self.info.rank_nodes.get(rank)

    def resolve(self, host: str | None) -> str | None:
        """The job's node that a host name or address from a log line names, if any."""
        if not host:
            return None
        host = host.strip().strip("[]").split("%", 1)[0]
        if host in self.nodes:
            return host
        if _is_ip(host):
            return None
        return self.short.get(host.split(".", 1)[0])


def _is_ip(text: str) -> bool:
    return bool(re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+(?:\d+\.\d+\.\d+\.\d+)?", text)) and any(c.isdigit() for c in text)


def _job_context(job: JobInfo, records: Sequence[LogRecord]) -> _Job:
    nodes = job.nodes or sorted({r.node for r in records if r.node})
    ranks = [r.rank for r in records if isinstance(r.rank, int) and r.rank >= 0]
    world = job.world_size or len(job.rank_nodes) or (max(ranks) + 1 if ranks else 0)
    short = {n.split(".", 1)[0]: n for n in nodes if not _is_ip(n)}
    return _Job(job, max(world, 0), list(nodes), short, tuple(sorted(set(nodes))))


def _ts(record: LogRecord) -> datetime:
    ts = record.ts
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _rank_of(record: LogRecord, fields: Mapping[str, Any]) -> int | None:
    """The record's global rank, else the one its message names when that is the default group's."""
    named = fields.get("rank") if fields.get("pg") in (None, 0) or fields.get("pg_name") == "default_pg" else None
    for value in (record.rank, named):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _occurrences(records: Iterable[LogRecord]) -> list[_Occ]:
    """Every record as the errors it carries; blocks (tracebacks, crashes, torchrun tables) are unwrapped."""
    out: list[_Occ] = []
    for r in records:
        fields = r.fields if isinstance(r.fields, Mapping) else {}
        rank = _rank_of(r, fields)
        error = fields.get("error")
        if r.kind == "child_failed":
            out.append(_Occ(r, "child_failed", fields, rank, r.node))
            root = fields.get("root_rank")
            rank = root if isinstance(root, int) and root >= 0 else rank
            if isinstance(error, Mapping) and error.get("kind"):
                out += _unwrap(r, error, rank, "child_failed")
            elif fields.get("exc_type"):
                tb = {k: fields.get(k) for k in ("exc_type", "exc_message", "last_frame")}
                out.append(_Occ(r, "traceback", tb, rank, r.node, via="child_failed"))
            continue
        if r.kind in ("traceback", "crash") and isinstance(error, Mapping) and error.get("kind"):
            context = {"exc_type": fields.get("exc_type"), "exc_message": fields.get("exc_message")}
            out += _unwrap(r, {**error, **{k: v for k, v in context.items() if v}}, rank, r.kind)
            continue
        out.append(_Occ(r, r.kind, fields, rank, r.node))
    return out


def _unwrap(r: LogRecord, error: Mapping[str, Any], rank: int | None, via: str) -> list[_Occ]:
    occs = [_Occ(r, str(error["kind"]), error, rank, r.node, via=via)]
    related = error.get("related")
    if isinstance(related, list):
        occs += [_Occ(r, str(e["kind"]), e, rank, r.node, via=via) for e in related if isinstance(e, Mapping)]
    return occs


def _clip(text: str, limit: int = LINE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _times(occs: Sequence[_Occ]) -> list[str]:
    """Distinct occurrence times: occurrences within BURST_S of the previous one are the same occurrence."""
    out: list[datetime] = []
    previous: datetime | None = None
    for ts in sorted(_ts(o.record) for o in occs):
        if previous is None or (ts - previous).total_seconds() > BURST_S:
            out.append(ts)
        previous = ts
    return [t.isoformat() for t in out[-MAX_LIST:]]  # the latest ones: flap tolerance looks back from now


def _evidence(occs: Sequence[_Occ], sig_text: str | None = None, **extra: Any) -> SignatureEvidence:
    """References to the records, the signature of the claim, a few raw lines, the count, and details."""
    ordered = sorted(occs, key=lambda o: (_ts(o.record), o.record.id))
    ids: list[int] = []
    lines: list[str] = []
    seen_lines: set[str] = set()
    for i, o in enumerate(ordered):
        if len(ids) < MAX_SIGNALS and o.record.id not in ids:
            ids.append(o.record.id)
        if len(lines) < MAX_LINES and i < 20 * MAX_LINES:  # quote distinct lines, looking at a few records only
            line = _clip(o.record.line or "")
            sig = signature(line)
            if sig not in seen_lines:
                seen_lines.add(sig)
                lines.append(line)
    first_line = ordered[0].record.line if ordered else ""
    ranks = sorted({o.rank for o in occs if o.rank is not None})
    nodes = sorted({o.node for o in occs if o.node})
    evidence: SignatureEvidence = {
        "signals": [{"type": "log", "id": i} for i in ids],
        "signature": signature(sig_text if sig_text is not None else first_line or ""),
        "lines": lines,
        "count": len({(o.record.id, o.kind) for o in occs}),
        "nodes": nodes[:MAX_LIST],
    }
    if ordered:
        evidence["last_at"] = _ts(ordered[-1].record).isoformat()
    if ranks:
        evidence["ranks"] = ranks[:MAX_LIST]
    evidence.update(cast(SignatureEvidence, {k: v for k, v in extra.items() if v is not None}))  # the rule's details
    return evidence


def _finding(
    occs: Sequence[_Occ],
    *,
    key: str,
    category: str,
    confidence: float,
    summary: str,
    node: str | None,
    subject_kind: str | None = None,
    subject: str | None = None,
    job: _Job,
    blame: str = "unknown",
    role: str = "cause",
    action: str = "none",
    sig_text: str | None = None,
    **extra: Any,
) -> Finding:
    """A finding over occurrences: node-level when `node` is given, else rank-level for one rank, else job."""
    if subject_kind is None:
        ranks = {o.rank for o in occs if o.rank is not None}
        if node is not None:
            subject_kind, subject = "node", node
        elif len(ranks) == 1 and len({o.node for o in occs}) == 1:
            subject_kind, subject = "rank", f"rank {next(iter(ranks))}"
        else:
            subject_kind, subject = "job", job.info.job_id
    return Finding(
        detector=DETECTOR,
        category=category,
        subject_kind=subject_kind,
        subject=subject or job.info.job_id,
        confidence=round(min(max(confidence, 0.0), 1.0), 3),
        summary=_clip(summary, 300),
        observed_at=min(_ts(o.record) for o in occs),
        node=node,
        blame=blame,
        role=role,
        action=action,
        key=key,
        evidence=_evidence(occs, sig_text, **extra),
    )


def _widespread(occs: Sequence[_Occ], job: _Job) -> bool:
    """On most of the job: at least half its ranks (two or more) and more than one node, or every node."""
    ranks = {o.rank for o in occs if o.rank is not None}
    nodes = {o.node for o in occs}
    many_nodes = len(nodes) >= 2 or (len(job.nodes) <= 1 and len(nodes) == 1)
    if ranks and job.world:
        return len(ranks) >= max(2, math.ceil(0.5 * job.world)) and many_nodes
    if len(job.nodes) >= 2:
        return len(nodes) >= max(2, math.ceil(0.5 * len(job.nodes)))
    return False


def _group(occs: Iterable[_Occ], key: Callable[[_Occ], Any]) -> dict[Any, list[_Occ]]:
    groups: dict[Any, list[_Occ]] = defaultdict(list)
    for o in occs:
        groups[key(o)].append(o)
    return groups


def _rank_note(occs: Sequence[_Occ]) -> str:
    ranks = sorted({o.rank for o in occs if o.rank is not None})
    if not ranks:
        return ""
    if len(ranks) == 1:
        return f" on rank {ranks[0]}"
    return f" on {len(ranks)} ranks"
