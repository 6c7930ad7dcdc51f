"""Rules for explicit failures: parsed log events (Xid, AER, IB, NCCL, CUDA, OOM, tracebacks, ...) into findings.

Each rule reads the events the node agent's parsers emit (`kind` and `fields` as in agents/parsers) and says
what broke, where, and whose fault it is:

- hardware signatures (fatal Xids, uncorrectable ECC, IB completion errors) point at the machine they were
  logged on: blame infrastructure;
- the same exception on most ranks is the job's own code: blame user code, never a machine;
- ambiguous errors (illegal memory access, a segfault) on one machine only are "suspect, diagnose";
- what victims print (watchdog timeouts, peers' NCCL errors, torchrun's summary) is a symptom: it
  corroborates a cause and may point at one (a desync report's lagging rank, a NCCL remote peer).

Repeats of one claim (an Xid code on a node, IB errors on a node, one exception on many ranks) are one finding
whose evidence lists the records and counts them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ml.findings import Finding, JobInfo, LogRecord
from ml.normalize import normalize, signature
from ml.xid import lookup, recovery_required

DETECTOR = "signatures"
MAX_SIGNALS = 50  # record references kept per finding
MAX_LINES = 3  # raw lines quoted per finding
LINE_CHARS = 500  # characters quoted per line
MAX_LIST = 64  # ranks, nodes, times listed per finding
BURST_S = 1.0  # occurrences closer than this are one (an IB error's Recv and Send lines)
MIN_CLASSIFIER_P = 0.5  # the learned classifier's lower bound for a finding

Classify = Callable[[list[str]], list[tuple[str, float]]]

_log = logging.getLogger(__name__)

# --- vocabularies -----------------------------------------------------------------------------------

# IB completion statuses that say the link or the peer stopped answering (ibv_wc_status).
_IB_LINK_STATUSES = frozenset({12, 13, 20})  # RETRY_EXC, RNR_RETRY_EXC, RESP_TIMEOUT
_IB_FLUSH = 5  # WR_FLUSH_ERR: the queue pair already failed; a consequence of another error

# CUDA error names (agents/parsers/training/cuda.py) by what they usually mean.
_CUDA_HARDWARE = frozenset({"ecc_uncorrectable"})
_CUDA_NVLINK = frozenset({"nvlink_uncorrectable"})
_CUDA_DEVICE_GONE = frozenset({"no_device", "initialization_error", "unknown_error", "devices_unavailable"})
_CUDA_USER = frozenset(
    {"device_assert", "no_kernel_image", "invalid_device_ordinal", "invalid_argument", "stream_capture"}
)
_CUDA_OOM = frozenset({"out_of_memory"})
_CUBLAS_USER = re.compile(r"(?:invalid_value|not_supported|not_initialized|bad_param|arch_mismatch|mapping_error)")
_ECC_WORDS = re.compile(r"(?i)uncorrectable|\bECC\b|double.bit")

_STORAGE_INFRA = re.compile(
    r"(?i)Input/output error|\bEIO\b|\[Errno 5\]|Stale file handle|\bESTALE\b|\[Errno 116\]|Read-only file system"
    r"|\bEROFS\b|\[Errno 30\]|Transport endpoint is not connected|\[Errno 107\]|Remote I/O error|\[Errno 121\]"
    r"|LustreError|\blustre\b.{0,40}(?:error|fail)|nfs: server \S+ not responding|\bNFS\b.{0,40}(?:error|fail|stale)"
    r"|\bGPFS\b.{0,40}(?:error|fail)|mmfs.{0,20}error"
)
_STORAGE_CAPACITY = re.compile(
    r"(?i)No space left on device|\bENOSPC\b|\[Errno 28\]|Disk quota exceeded|\bEDQUOT\b|\[Errno 122\]"
)
_HARDWARE_WORDS = re.compile(
    r"(?i)uncorrectable ECC|double bit error|fallen off the bus|\bXid\b|NVLink (?:error|fatal)|GPU is lost"
    r"|Unable to determine the device handle|GPU requires reset|nvidia-smi has failed|RmInitAdapter failed"
)
# What a victim of another rank's failure says (the peer died, the collective was aborted, a store timed out).
_VICTIM_WORDS = re.compile(
    r"(?i)Connection closed by (?:remote )?peer|remote worker crash|Connection reset by peer|Broken pipe"
    r"|communicator was aborted|ProcessGroup\w* .{0,40}abort|Socket Timeout|timed out|Timeout|watchdog"
    r"|remote process exited|ncclRemoteError|ncclSystemError|DistBackendError|DistNetworkError|DistStoreError"
    r"|RendezvousError|Rendezvous\w+Error|NCCL error|NCCL communicator"
)
_VICTIM_TYPES = frozenset(
    {
        "KeyboardInterrupt",
        "SystemExit",
        "SignalException",
        "ChildFailedError",
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",
        "RendezvousClosedError",
        "RendezvousConnectionError",
        "RendezvousTimeoutError",
        "RendezvousGracefulExitError",
        "BrokenPipeError",
        "ConnectionResetError",
    }
)
# Plain Python errors: a bug in the code or the data when raised from the job's own frames.
_PYTHON_ERRORS = frozenset(
    {
        "RuntimeError",
        "ValueError",
        "KeyError",
        "IndexError",
        "TypeError",
        "AttributeError",
        "AssertionError",
        "NameError",
        "UnboundLocalError",
        "ZeroDivisionError",
        "NotImplementedError",
        "ImportError",
        "ModuleNotFoundError",
        "FileNotFoundError",
        "IsADirectoryError",
        "NotADirectoryError",
        "PermissionError",
        "RecursionError",
        "StopIteration",
        "OverflowError",
        "UnicodeDecodeError",
        "UnicodeEncodeError",
        "JSONDecodeError",
        "SyntaxError",
        "IndentationError",
        "LookupError",
        "ArithmeticError",
    }
)
_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python\d|<frozen|^<")
_SHM = re.compile(r"(?i)shared memory|/dev/shm|\bshm\b")
_HOST_IN_TEXT = re.compile(r"\(host ([\w.-]+)\)|(?:peer|to|from) ([\w.:%-]+?)<\d+>|remote peer ([\w.-]+)")


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


def _evidence(occs: Sequence[_Occ], sig_text: str | None = None, **extra: Any) -> dict[str, Any]:
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
    evidence: dict[str, Any] = {
        "signals": [{"type": "log", "id": i} for i in ids],
        "signature": signature(sig_text if sig_text is not None else first_line or ""),
        "lines": lines,
        "count": len({(o.record.id, o.kind) for o in occs}),
        "nodes": nodes[:MAX_LIST],
    }
    if ranks:
        evidence["ranks"] = ranks[:MAX_LIST]
    evidence.update({k: v for k, v in extra.items() if v is not None})
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


# --- hardware: Xid, NVRM, SXid, PCIe AER --------------------------------------------------------------


# An Xid line as the kernel prints it, for events that arrive without parsed fields (another agent, a curl).
_XID_LINE = re.compile(r"\bXid\b\s*(?:\(([^)]*)\))?\s*:?\s*(\d+)\b")


def _xid_code(o: _Occ) -> int | None:
    if o.kind == "xid":
        code = o.fields.get("xid")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
        m = _XID_LINE.search(o.record.line)
        return int(m.group(2)) if m else None
    if o.kind == "nvrm" and "fallen off the bus" in str(o.fields.get("message") or o.record.line):
        return 79  # "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." without an Xid line
    return None


def _pci(o: _Occ) -> str | None:
    pci = o.fields.get("pci")
    if not isinstance(pci, str) or not pci:
        return None
    # Xid lines name the device (0000:b3:00), other lines the function (0000:b3:00.0): compare as devices.
    return pci.lower().rsplit(".", 1)[0] if pci.count(":") == 2 and "." in pci else pci.lower()


def _xid_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    by_key: dict[tuple[str, int], list[_Occ]] = defaultdict(list)
    for o in occs:
        code = _xid_code(o)
        if code is not None:
            by_key[(o.node, code)].append(o)
    findings: list[Finding] = []
    # Application-level Xids of one code on many nodes: the job's kernels, not the machines.
    app_nodes: dict[int, set[str]] = defaultdict(set)
    for node, code in by_key:
        if lookup(code).severity == "application":
            app_nodes[code].add(node)
    app_job_codes = {c for c, nodes in app_nodes.items() if len(nodes) >= 2 and len(nodes) >= 0.5 * len(job.nodes)}
    for code in sorted(app_job_codes):
        group = [o for (node, c), os in by_key.items() if c == code for o in os]
        entry = lookup(code)
        findings.append(
            _finding(
                group,
                key=f"xid:{code}:job",
                category="user_code",
                confidence=0.6,
                summary=f"Xid {code} ({entry.name}) on {len(app_nodes[code])} nodes: the job's own GPU code",
                node=None,
                job=job,
                blame="user_code",
                action="none",
                sig_text=f"xid {code}",
                **_xid_details(code, group),
            )
        )
    for (node, code), group in sorted(by_key.items()):
        if code in app_job_codes:
            continue
        finding = _xid_finding(node, code, group, job)
        if finding is not None:
            findings.append(finding)
    return findings


def _xid_details(code: int, group: Sequence[_Occ]) -> dict[str, Any]:
    entry = lookup(code)
    messages: list[str] = []
    for o in group:
        msg = str(o.fields.get("message") or "")
        if msg and msg not in messages and len(messages) < MAX_LINES:
            messages.append(_clip(msg, 300))
    processes = sorted({str(o.fields["process"]) for o in group if o.fields.get("process")})
    return {
        "xid": code,
        "mnemonic": entry.mnemonic or None,
        "description": entry.description or None,
        "immediate_action": entry.immediate_action or None,
        "investigatory_action": entry.investigatory_action or None,
        "xid_severity": entry.severity,
        "pci": sorted({p for o in group if (p := _pci(o))}) or None,
        "processes": processes or None,
        "messages": messages or None,
    }


def _xid_finding(node: str, code: int, group: list[_Occ], job: _Job) -> Finding | None:
    entry = lookup(code)
    category, action, blame, confidence, role = (
        entry.category,
        entry.action,
        entry.blame,
        entry.confidence,
        "cause",
    )
    if code == 154:
        actions = [str(o.fields.get("recovery_action") or "") for o in group]
        if not any(recovery_required(a) for a in actions):
            return None  # informational: the recovery action went back to none
        category, action, blame, confidence = "gpu_hardware", "evict", "infrastructure", 0.9
    elif entry.severity == "informational":
        return None  # the catalog says ignore: nothing a job would fail of
    elif entry.severity == "consequence":
        role = "symptom"
    if 144 <= code <= 150 and all(o.fields.get("fatal") is False for o in group):
        action, confidence = "diagnose", 0.6  # a non-fatal NVLink5 event: worth a look, not a drain
    pcis = sorted({p for o in group if (p := _pci(o))})
    where = f"{node} GPU {pcis[0]}" if len(pcis) == 1 else node
    count = f" x{len(group)}" if len(group) > 1 else ""
    return _finding(
        group,
        key=f"xid:{node}:{code}",
        category=category,
        confidence=confidence,
        summary=f"Xid {code} ({entry.name}){count} on {where}",
        node=node,
        subject_kind="gpu" if len(pcis) == 1 else "node",
        subject=f"{node}/{pcis[0]}" if len(pcis) == 1 else node,
        job=job,
        blame=blame,
        role=role,
        action=action,
        sig_text=f"xid {code}",
        **_xid_details(code, group),
    )


_RM_INIT = re.compile(r"(?i)RmInitAdapter failed|rm_init_adapter failed|GPU is lost|unable to communicate with")


def _nvrm_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """NVRM lines saying a GPU failed to initialize (the driver cannot use it)."""
    groups = _group(
        (
            o
            for o in occs
            if o.kind == "nvrm" and _xid_code(o) is None and _RM_INIT.search(str(o.fields.get("message")))
        ),
        lambda o: (o.node, _pci(o)),
    )
    findings = []
    for (node, pci), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        findings.append(
            _finding(
                group,
                key=f"nvrm_init:{node}:{pci or '-'}",
                category="gpu_hardware",
                confidence=0.6,
                summary=f"NVIDIA driver cannot initialize GPU {pci or '?'} on {node}",
                node=node,
                subject_kind="gpu" if pci else "node",
                subject=f"{node}/{pci}" if pci else node,
                job=job,
                blame="infrastructure",
                action="diagnose",
                sig_text="nvrm init failed",
                pci=pci,
            )
        )
    return findings


def _sxid_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    groups = _group((o for o in occs if o.kind == "sxid"), lambda o: (o.node, o.fields.get("sxid")))
    findings = []
    for (node, code), group in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        fatal = any(o.fields.get("fatal") for o in group)
        switches = sorted({str(o.fields["switch"]) for o in group if o.fields.get("switch")})
        findings.append(
            _finding(
                group,
                key=f"sxid:{node}:{code}",
                category="nvlink",
                confidence=0.85 if fatal else 0.5,
                summary=f"NVSwitch SXid {code} ({'fatal' if fatal else 'non-fatal'}) on {node}",
                node=node,
                job=job,
                blame="infrastructure",
                action="evict" if fatal else "diagnose",
                sig_text=f"sxid {code} {fatal}",
                sxid=code,
                fatal=fatal,
                switches=switches or None,
                links=sorted({o.fields["link"] for o in group if isinstance(o.fields.get("link"), int)}) or None,
            )
        )
    return findings


_AER_LEVEL = {
    "corrected": (0.25, "diagnose"),
    "uncorrected_nonfatal": (0.6, "diagnose"),
    "uncorrected_fatal": (0.85, "evict"),
}


def _aer_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    groups = _group(
        (o for o in occs if o.kind == "pcie_aer"),
        lambda o: (o.node, str(o.fields.get("device") or ""), str(o.fields.get("severity") or "corrected")),
    )
    findings = []
    for (node, device, severity), group in sorted(groups.items()):
        confidence, action = _AER_LEVEL.get(severity, (0.25, "diagnose"))
        if severity == "corrected":
            confidence = min(0.45, confidence + 0.02 * (len(group) - 1))  # a flood says more than one
        errors = sorted({str(e) for o in group for e in (o.fields.get("errors") or []) if isinstance(e, str)})
        findings.append(
            _finding(
                group,
                key=f"aer:{node}:{device}:{severity}",
                category="pcie",
                confidence=confidence,
                summary=f"PCIe AER {severity.replace('_', ' ')} errors x{len(group)} at {device or '?'} on {node}",
                node=node,
                job=job,
                blame="infrastructure",
                action=action,
                sig_text=f"aer {severity}",
                device=device or None,
                aer_severity=severity,
                aer_errors=errors or None,
                aer_type=next((str(o.fields["type"]) for o in group if o.fields.get("type")), None),
            )
        )
    return findings


# --- network: IB completion errors, NCCL errors -------------------------------------------------------


def _ib_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    groups = _group((o for o in occs if o.kind == "ib_error"), lambda o: o.node)
    findings = []
    for node, group in sorted(groups.items()):
        statuses = sorted({s for o in group if isinstance(s := o.fields.get("status"), int)})
        names = sorted({str(o.fields["status_name"]) for o in group if o.fields.get("status_name")})
        link = [s for s in statuses if s in _IB_LINK_STATUSES]
        if link:
            confidence, action, blame = 0.85, "evict", "infrastructure"
        elif statuses and set(statuses) <= {_IB_FLUSH}:
            confidence, action, blame = 0.45, "diagnose", "unknown"  # flushed after an earlier failure
        else:
            confidence, action, blame = 0.5, "diagnose", "unknown"  # protection/access errors: often software
        peers = sorted({str(o.fields["peer"]) for o in group if o.fields.get("peer")})
        peer_nodes = sorted({p for peer in peers if (p := job.resolve(peer)) and p != node})
        times = _times(group)
        label = ", ".join(f"status {s}" for s in statuses) or "error"
        findings.append(
            _finding(
                group,
                key=f"ib:{node}",
                category="network",
                confidence=confidence,
                summary=f"InfiniBand completion {label} on {node} ({len(times)} occurrence{'s' * (len(times) > 1)})",
                node=node,
                job=job,
                blame=blame,
                action=action,
                sig_text=f"ib {link or statuses}",
                times=times,
                statuses=statuses,
                status_names=names or None,
                peers=peers[:MAX_LIST] or None,
                peer_nodes=peer_nodes or None,
                vendor_errors=sorted({v for o in group if isinstance(v := o.fields.get("vendor_err"), int)}) or None,
            )
        )
    return findings


def _peer_named(o: _Occ) -> str | None:
    """The peer host or address a NCCL error names: its field, or "(host X)", "peer X<port>" in its text."""
    peer = o.fields.get("peer")
    if isinstance(peer, str) and peer:
        return peer
    text = " ".join(str(o.fields.get(k) or "") for k in ("message", "last_error"))
    m = _HOST_IN_TEXT.search(text)
    if m:
        return next(g for g in m.groups() if g)
    return None


def _carries_ib(o: _Occ) -> bool:
    """A NCCL error whose last error is this machine's own IB completion error: the IB rule covers it."""
    related = o.fields.get("related")
    if isinstance(related, list) and any(isinstance(e, Mapping) and e.get("kind") == "ib_error" for e in related):
        return True
    return "Got completion" in str(o.fields.get("last_error") or "")


def _is_remote(o: _Occ) -> bool:
    text = " ".join(str(o.fields.get(k) or "") for k in ("message", "last_error")).lower()
    return (
        o.fields.get("nccl_code") == "ncclRemoteError"
        or "remote" in text
        or "closed by" in text
        or "connect to" in text
        or o.fields.get("category") == "socket"
    )


def _nccl_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    errors = [o for o in occs if o.kind == "nccl_error"]
    if not errors:
        return []
    pointers: dict[str, list[_Occ]] = defaultdict(list)
    peers_unresolved: set[str] = set()
    for o in errors:
        peer = _peer_named(o)
        if not peer or not _is_remote(o) or _carries_ib(o):
            continue
        peer_node = job.resolve(peer)
        if peer_node and peer_node != o.node:
            pointers[peer_node].append(o)
        elif not peer_node:
            peers_unresolved.add(peer)
    findings: list[Finding] = []
    for peer_node, group in sorted(pointers.items()):
        reporters = {o.node for o in group}
        # Several machines naming the same peer say more than one; still only a pointer, never an eviction.
        confidence = min(0.65, 0.35 + 0.1 * (len(reporters) - 1))
        findings.append(
            _finding(
                group,
                key=f"nccl_peer:{peer_node}",
                category="job_failure",
                confidence=confidence,
                summary=f"NCCL errors on {len(reporters)} node{'s' * (len(reporters) > 1)} name peer {peer_node}",
                node=peer_node,
                job=job,
                role="symptom",
                action="diagnose",
                sig_text=f"nccl peer {peer_node}",
                reporters=sorted(reporters),
            )
        )
    codes = sorted({str(o.fields["nccl_code"]) for o in errors if o.fields.get("nccl_code")})
    findings.append(
        _finding(
            errors,
            key="nccl_error",
            category="job_failure",
            confidence=0.3,
            summary=f"NCCL errors{_rank_note(errors)} ({', '.join(codes) or 'no code'})",
            node=None,
            job=job,
            role="symptom",
            sig_text="nccl error " + " ".join(codes),
            nccl_codes=codes or None,
            peers=sorted(peers_unresolved)[:MAX_LIST] or None,
        )
    )
    return findings


# --- symptoms: watchdog, collectives, desync, torchrun, elastic --------------------------------------

_SYMPTOM_NAMES = {
    "watchdog_timeout": "NCCL watchdog timeouts",
    "watchdog_exception": "NCCL watchdog exceptions",
    "collective_timeout": "collective timeouts",
    "child_failed": "torchrun: worker processes failed",
    "elastic_error": "torchrun elastic agent errors",
    "cpp_exception": "C++ exceptions",
}


def _symptom_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    findings: list[Finding] = []
    for kind, name in _SYMPTOM_NAMES.items():
        group = [o for o in occs if o.kind == kind]
        if not group:
            continue
        extra: dict[str, Any] = {}
        if kind == "watchdog_timeout":
            seqs = sorted({s for o in group if isinstance(s := o.fields.get("seq"), int)})
            extra = {"seqs": seqs[:MAX_LIST] or None, "ops": sorted({str(o.fields.get("op")) for o in group})}
        elif kind == "child_failed":
            failed = sorted({r for o in group for r in (o.fields.get("failures") or []) if isinstance(r, int)})
            roots = sorted({r for o in group if isinstance(r := o.fields.get("root_rank"), int)})
            signals = sorted({str(o.fields["signal"]) for o in group if o.fields.get("signal")})
            extra = {"failed_ranks": failed or None, "root_ranks": roots or None, "exit_signals": signals or None}
        findings.append(
            _finding(
                group,
                key=f"symptom:{kind}",
                category="job_failure",
                confidence=0.3,
                summary=f"{name}{_rank_note(group)}",
                node=None,
                job=job,
                role="symptom",
                sig_text=kind,
                **extra,
            )
        )
    findings += _pointer_findings(occs, job)
    return findings


def _pointer_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """Symptoms that name the ranks others waited for: a desync report's lagging ranks, a failed barrier."""
    pointed: dict[str, list[_Occ]] = defaultdict(list)
    pointed_ranks: dict[str, set[int]] = defaultdict(set)
    unresolved: list[_Occ] = []
    for o in occs:
        ranks: list[int] = []
        if o.kind == "desync_report":
            ranks = [r for r in o.fields.get("lagging_ranks") or [] if isinstance(r, int)]
        elif o.kind == "collective_timeout" and isinstance(o.fields.get("failed_rank"), int):
            ranks = [o.fields["failed_rank"]]
        elif o.kind == "elastic_error" and o.fields.get("category") in ("heartbeat", "rendezvous_shutdown"):
            node = job.resolve(str(o.fields.get("node") or ""))
            if node:
                pointed[node].append(o)
            continue
        else:
            continue
        nodes = {n for r in ranks if (n := job.node_of_rank(r))}
        if len(nodes) == 1:
            node = next(iter(nodes))
            pointed[node].append(o)
            pointed_ranks[node].update(ranks)
        else:
            unresolved.append(o)
    findings = [
        _finding(
            group,
            key=f"pointer:{node}",
            category="job_failure",
            confidence=0.45,
            summary=f"peers waited for {node}"
            + (f" (ranks {sorted(pointed_ranks[node])})" if pointed_ranks[node] else ""),
            node=node,
            job=job,
            role="symptom",
            action="diagnose",
            sig_text=f"pointer {node}",
            lagging_ranks=sorted(pointed_ranks[node]) or None,
        )
        for node, group in sorted(pointed.items())
    ]
    desyncs = [o for o in unresolved if o.kind == "desync_report"]
    if desyncs:
        lagging = sorted({r for o in desyncs for r in o.fields.get("lagging_ranks") or [] if isinstance(r, int)})
        findings.append(
            _finding(
                desyncs,
                key="desync_report",
                category="job_failure",
                confidence=0.3,
                summary="NCCL desync report" + (f": ranks {lagging[:8]} did not join" if lagging else ""),
                node=None,
                job=job,
                role="symptom",
                sig_text="desync",
                lagging_ranks=lagging[:MAX_LIST] or None,
            )
        )
    return findings


# --- CUDA errors, OOM, data loaders, storage ------------------------------------------------------------


def _cuda_class(o: _Occ) -> str:
    """hardware, nvlink, device_gone, user, oom or ambiguous."""
    name = str(o.fields.get("error") or "")
    message = str(o.fields.get("message") or "")
    if name in _CUDA_HARDWARE or _ECC_WORDS.search(message) or _ECC_WORDS.search(name):
        return "hardware"
    if name in _CUDA_NVLINK:
        return "nvlink"
    if name in _CUDA_OOM or "alloc_failed" in name:
        return "oom"
    if name in _CUDA_DEVICE_GONE:
        return "device_gone"
    if name in _CUDA_USER or _CUBLAS_USER.search(name):
        return "user"
    return "ambiguous"


def _cuda_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    errors = [o for o in occs if o.kind == "cuda_error"]
    findings: list[Finding] = []
    by_class = _group(errors, _cuda_class)
    for cls, group in sorted(by_class.items()):
        names = sorted({str(o.fields.get("error") or "?") for o in group})
        label = ", ".join(names)
        if cls in ("hardware", "nvlink"):
            category = "gpu_hardware" if cls == "hardware" else "nvlink"
            for node, ngroup in sorted(_group(group, lambda o: o.node).items()):
                findings.append(
                    _finding(
                        ngroup,
                        key=f"cuda:{cls}:{node}",
                        category=category,
                        confidence=0.9 if cls == "hardware" else 0.8,
                        summary=f"CUDA error {label}{_rank_note(ngroup)} on {node}",
                        node=node,
                        job=job,
                        blame="infrastructure",
                        action="evict",
                        sig_text=f"cuda {cls}",
                        cuda_errors=names,
                    )
                )
        elif cls == "oom":
            findings.append(_oom_finding(group, job, "GPU"))
        elif cls == "user" or _widespread(group, job):
            wide = _widespread(group, job)
            findings.append(
                _finding(
                    group,
                    key=f"cuda:{cls}:job",
                    category="user_code",
                    confidence=0.85 if wide else 0.6,
                    summary=f"CUDA error {label}{_rank_note(group)}"
                    + (": on most ranks, the job's own code" if wide else ""),
                    node=None,
                    job=job,
                    blame="user_code",
                    action="rollback" if wide else "none",
                    sig_text=f"cuda {cls} {label}",
                    cuda_errors=names,
                    widespread=wide,
                )
            )
        else:
            # Ambiguous or a device gone, on few machines: a suspect to diagnose, not yet a culprit.
            for node, ngroup in sorted(_group(group, lambda o: o.node).items()):
                gone = cls == "device_gone"
                findings.append(
                    _finding(
                        ngroup,
                        key=f"cuda:{cls}:{node}",
                        category="gpu_hardware" if gone else "unknown",
                        confidence=0.55 if gone else 0.5,
                        summary=f"CUDA error {label}{_rank_note(ngroup)} on {node} only",
                        node=node,
                        job=job,
                        blame="infrastructure" if gone else "unknown",
                        action="diagnose",
                        sig_text=f"cuda {cls}",
                        cuda_errors=names,
                    )
                )
    return findings


def _oom_finding(group: Sequence[_Occ], job: _Job, what: str) -> Finding:
    tried = sorted({t for o in group if isinstance(t := o.fields.get("tried_bytes"), int)})
    return _finding(
        group,
        key=f"oom:{what.lower()}",
        category="oom",
        confidence=0.85 if what == "GPU" else 0.5,
        summary=f"{what} out of memory{_rank_note(group)}",
        node=None,
        job=job,
        blame="user_code",
        action="none",
        sig_text=f"oom {what}",
        tried_bytes=tried[:MAX_LIST] or None,
    )


def _oom_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    group = [o for o in occs if o.kind == "oom"]
    return [_oom_finding(group, job, "GPU")] if group else []


def _dataloader_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    died = [o for o in occs if o.kind == "dataloader_died"]
    findings: list[Finding] = []
    shm = [o for o in died if o.fields.get("shm") or _SHM.search(str(o.fields.get("exc_message") or ""))]
    shm_set = set(shm)
    killed = [o for o in died if o not in shm_set and "kill" in str(o.fields.get("signal") or "").lower()]
    taken = shm_set | set(killed)
    other = [o for o in died if o not in taken]
    if shm:
        if _widespread(shm, job) or len(job.nodes) <= 1:
            findings.append(
                _finding(
                    shm,
                    key="dataloader:shm:job",
                    category="storage",
                    confidence=0.6,
                    summary=f"data loader workers ran out of shared memory (/dev/shm){_rank_note(shm)}",
                    node=None,
                    job=job,
                    action="none",
                    sig_text="dataloader shm",
                )
            )
        else:
            for node, group in sorted(_group(shm, lambda o: o.node).items()):
                findings.append(
                    _finding(
                        group,
                        key=f"dataloader:shm:{node}",
                        category="storage",
                        confidence=0.55,
                        summary=f"data loader workers ran out of shared memory (/dev/shm) on {node}",
                        node=node,
                        job=job,
                        action="diagnose",
                        sig_text="dataloader shm",
                    )
                )
    if killed:
        findings.append(_oom_finding(killed, job, "host"))
    if other:
        signals = sorted({str(o.fields.get("signal") or "exited") for o in other})
        findings.append(
            _finding(
                other,
                key="dataloader:died",
                category="user_code",
                confidence=0.45,
                summary=f"data loader workers died ({', '.join(signals)}){_rank_note(other)}",
                node=None,
                job=job,
                blame="user_code",
                action="none",
                sig_text="dataloader died " + " ".join(signals),
                signals=signals,
            )
        )
    return findings


def _storage_finding(group: Sequence[_Occ], job: _Job, text_of: Callable[[_Occ], str]) -> list[Finding]:
    """Filesystem errors: a mount failing on one machine is that machine's; on most, the shared filesystem's."""
    findings: list[Finding] = []
    infra = [o for o in group if _STORAGE_INFRA.search(text_of(o))]
    infra_set = set(infra)
    capacity = [o for o in group if o not in infra_set]
    for kind, part in (("io", infra), ("capacity", capacity)):
        if not part:
            continue
        blame = "infrastructure" if kind == "io" else "unknown"
        what = "filesystem I/O errors" if kind == "io" else "filesystem full or over quota"
        if _widespread(part, job) or len(job.nodes) <= 1:
            findings.append(
                _finding(
                    part,
                    key=f"storage:{kind}:job",
                    category="storage",
                    confidence=0.7 if kind == "io" else 0.6,
                    summary=f"{what}{_rank_note(part)}",
                    node=None,
                    job=job,
                    blame=blame,
                    action="none",
                    sig_text=f"storage {kind}",
                )
            )
            continue
        for node, ngroup in sorted(_group(part, lambda o: o.node).items()):
            findings.append(
                _finding(
                    ngroup,
                    key=f"storage:{kind}:{node}",
                    category="storage",
                    confidence=0.6 if kind == "io" else 0.5,
                    summary=f"{what} on {node}",
                    node=node,
                    job=job,
                    blame=blame,
                    action="diagnose",
                    sig_text=f"storage {kind}",
                )
            )
    return findings


# --- tracebacks and crashes -----------------------------------------------------------------------------


def _exc_text(o: _Occ) -> str:
    return f"{o.fields.get('exc_type') or ''}: {o.fields.get('exc_message') or ''}"


def _short_type(exc_type: str) -> str:
    return exc_type.rsplit(".", 1)[-1].rsplit("::", 1)[-1]


def _last_frame(o: _Occ) -> Mapping[str, Any]:
    frame = o.fields.get("last_frame")
    return frame if isinstance(frame, Mapping) else {}


def _user_frame(o: _Occ) -> bool:
    file = str(_last_frame(o).get("file") or "")
    return bool(file) and not _LIBRARY_PATH.search(file)


def _tb_signature_text(o: _Occ, hosts: Sequence[str]) -> str:
    """Exception type, normalized message and last frame: the same on every rank that hit the same bug."""
    frame = _last_frame(o)
    where = f"{str(frame.get('file') or '').rsplit('/', 1)[-1]}:{frame.get('function') or ''}"
    return f"{o.fields.get('exc_type')}|{normalize(str(o.fields.get('exc_message') or ''), hosts=hosts)}|{where}"


def _traceback_findings(occs: list[_Occ], job: _Job, classify: Classify | None) -> tuple[list[Finding], list[_Occ]]:
    """Same exception on most ranks: user code. On few ranks: by what the exception says. Returns the
    tracebacks no rule knows, for the classifier."""
    tbs = [o for o in occs if o.kind == "traceback" and o.fields.get("exc_type")]
    findings: list[Finding] = []
    unknown: list[_Occ] = []
    storage: list[_Occ] = []
    groups = _group(tbs, lambda o: _tb_signature_text(o, job.hosts))
    for sig_text, group in sorted(groups.items()):
        exc_type = str(group[0].fields.get("exc_type"))
        short = _short_type(exc_type)
        text = _exc_text(group[0])
        victim = short in _VICTIM_TYPES or bool(_VICTIM_WORDS.search(text))
        if _STORAGE_INFRA.search(text) or _STORAGE_CAPACITY.search(text):
            storage += group
            continue
        if victim:
            findings.append(
                _finding(
                    group,
                    key=f"traceback:symptom:{signature(sig_text)}",
                    category="job_failure",
                    confidence=0.3,
                    summary=f"{short} (a peer or the launcher ended the rank){_rank_note(group)}",
                    node=None,
                    job=job,
                    role="symptom",
                    sig_text=sig_text,
                    exc_type=exc_type,
                )
            )
            continue
        if _HARDWARE_WORDS.search(text):
            findings += [_hardware_word_finding(g, job, n) for n, g in sorted(_group(group, lambda o: o.node).items())]
            continue
        if _widespread(group, job):
            findings.append(
                _finding(
                    group,
                    key=f"traceback:user:{signature(sig_text)}",
                    category="user_code",
                    confidence=0.9,
                    summary=f"the same {short} on {len({o.rank for o in group})} ranks: {_clip(text, 160)}",
                    node=None,
                    job=job,
                    blame="user_code",
                    action="rollback",
                    sig_text=sig_text,
                    exc_type=exc_type,
                    last_frame=dict(_last_frame(group[0])) or None,
                )
            )
            continue
        known = short in _PYTHON_ERRORS
        if known or classify is None:
            # One rank's Python error is still the job's code; less sure when raised inside a library.
            confidence = 0.6 if known and _user_frame(group[0]) else 0.45 if known else 0.4
            findings.append(
                _finding(
                    group,
                    key=f"traceback:user:{signature(sig_text)}",
                    category="user_code",
                    confidence=confidence,
                    summary=f"{short}{_rank_note(group)}: {_clip(text, 160)}",
                    node=None,
                    job=job,
                    blame="user_code",
                    action="diagnose",
                    sig_text=sig_text,
                    exc_type=exc_type,
                    last_frame=dict(_last_frame(group[0])) or None,
                )
            )
            continue
        unknown += group
    if storage:
        findings += _storage_finding(storage, job, _exc_text)
    return findings, unknown


def _hardware_word_finding(group: Sequence[_Occ], job: _Job, node: str) -> Finding:
    return _finding(
        group,
        key=f"hardware_words:{node}",
        category="gpu_hardware",
        confidence=0.5,
        summary=f"GPU failure reported in the logs of {node}",
        node=node,
        job=job,
        blame="infrastructure",
        action="diagnose",
        sig_text="hardware words",
    )


def _crash_text(o: _Occ) -> str:
    return f"{o.fields.get('reason') or ''} {o.fields.get('exc_type') or ''} {o.fields.get('message') or ''}"


def _crash_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """Processes dying without a known error: a segfault on every rank is the code's, on one rank a suspect."""
    crashes = [o for o in occs if o.kind == "crash"]
    findings: list[Finding] = []
    storage = [o for o in crashes if _STORAGE_INFRA.search(_crash_text(o)) or _STORAGE_CAPACITY.search(_crash_text(o))]
    if storage:
        findings += _storage_finding(storage, job, _crash_text)
    storage_set = set(storage)
    rest = [o for o in crashes if o not in storage_set]
    victims = [o for o in rest if _VICTIM_WORDS.search(_crash_text(o))]
    victim_set = set(victims)
    killed = [o for o in rest if o not in victim_set and o.fields.get("reason") == "killed"]
    if victims:
        findings.append(
            _finding(
                victims,
                key="crash:symptom",
                category="job_failure",
                confidence=0.3,
                summary=f"processes aborted after a collective failed{_rank_note(victims)}",
                node=None,
                job=job,
                role="symptom",
                sig_text="crash victim",
            )
        )
    if killed:
        findings.append(_oom_finding(killed, job, "host"))
    taken = victim_set | set(killed)
    others = [o for o in rest if o not in taken]
    for sig_text, group in sorted(
        _group(others, lambda o: normalize(_crash_text(o), hosts=job.hosts)).items(), key=lambda kv: kv[0]
    ):
        reason = str(group[0].fields.get("reason") or "crash")
        if _HARDWARE_WORDS.search(sig_text):
            findings += [_hardware_word_finding(g, job, n) for n, g in sorted(_group(group, lambda o: o.node).items())]
        elif _widespread(group, job):
            findings.append(
                _finding(
                    group,
                    key=f"crash:user:{signature(sig_text)}",
                    category="user_code",
                    confidence=0.7,
                    summary=f"{reason} on {len({o.rank for o in group})} ranks: the job's own code",
                    node=None,
                    job=job,
                    blame="user_code",
                    action="rollback",
                    sig_text=sig_text,
                    reason=reason,
                )
            )
        else:
            for node, ngroup in sorted(_group(group, lambda o: o.node).items()):
                findings.append(
                    _finding(
                        ngroup,
                        key=f"crash:{node}:{signature(sig_text)}",
                        category="unknown",
                        confidence=0.4,
                        summary=f"process crashed ({reason}){_rank_note(ngroup)} on {node}",
                        node=node,
                        job=job,
                        action="diagnose",
                        sig_text=sig_text,
                        reason=reason,
                    )
                )
    return findings


# --- unmatched lines and the classifier ------------------------------------------------------------------

_CLASSIFIED_NODE = frozenset({"gpu_hardware", "network", "storage"})
_CLASSIFIED_JOB = frozenset({"user_code", "oom", "nan"})


def _unmatched_findings(
    occs: list[_Occ], unknown_tbs: list[_Occ], job: _Job, classify: Classify | None
) -> list[Finding]:
    lines = [o for o in occs if o.kind == "unmatched_error"]
    findings: list[Finding] = []
    storage = [o for o in lines if _STORAGE_INFRA.search(o.record.line) or _STORAGE_CAPACITY.search(o.record.line)]
    if storage:
        findings += _storage_finding(storage, job, lambda o: o.record.line)
    storage_set = set(storage)
    hardware = [o for o in lines if o not in storage_set and _HARDWARE_WORDS.search(o.record.line)]
    for node, group in sorted(_group(hardware, lambda o: o.node).items()):
        findings.append(_hardware_word_finding(group, job, node))
    taken = storage_set | set(hardware)
    rest = [o for o in lines if o not in taken] + unknown_tbs
    if classify is None or not rest:
        return findings
    findings += _classified(rest, job, classify)
    return findings


def _classifier_text(o: _Occ) -> str:
    return _exc_text(o) if o.kind == "traceback" else o.record.line


def _classified(occs: list[_Occ], job: _Job, classify: Classify) -> list[Finding]:
    """The learned classifier's reading of lines no rule knows: low to moderate confidence, diagnose at most."""
    by_sig = _group(occs, lambda o: signature(_classifier_text(o), hosts=job.hosts))
    sigs = sorted(by_sig)
    texts = [_classifier_text(by_sig[s][0])[:2000] for s in sigs]
    try:
        answers = classify(texts)
    except Exception:  # a broken model must not take the rules down with it
        _log.warning("log classifier failed", exc_info=True)
        return []
    groups: dict[tuple[str, str | None], list[_Occ]] = defaultdict(list)
    best: dict[tuple[str, str | None], float] = defaultdict(float)
    for sig, answer in zip(sigs, answers, strict=False):
        try:
            category, p = str(answer[0]), float(answer[1])
        except (TypeError, ValueError, IndexError):
            continue
        if p < MIN_CLASSIFIER_P or not math.isfinite(p):
            continue
        if category in _CLASSIFIED_NODE:
            for node, group in _group(by_sig[sig], lambda o: o.node).items():
                groups[(category, node)] += group
                best[(category, node)] = max(best[(category, node)], p)
        elif category in _CLASSIFIED_JOB:
            groups[(category, None)] += by_sig[sig]
            best[(category, None)] = max(best[(category, None)], p)
    findings = []
    for (category, node), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        p = best[(category, node)]
        on_node = node is not None
        findings.append(
            _finding(
                group,
                key=f"classified:{category}:{node or 'job'}",
                category=category,
                confidence=min(0.55, 0.6 * p) if on_node else min(0.5, 0.55 * p),
                summary=f"log lines read as {category.replace('_', ' ')}" + (f" on {node}" if on_node else ""),
                node=node,
                job=job,
                blame="infrastructure"
                if on_node and category != "storage"
                else "user_code"
                if not on_node
                else "unknown",
                action="diagnose" if on_node else "none",
                sig_text=f"classified {category}",
                classifier_probability=round(p, 3),
            )
        )
    return findings


# --- entry point ---------------------------------------------------------------------------------------------

_RULES: tuple[Callable[[list[_Occ], _Job], list[Finding]], ...] = (
    _xid_findings,
    _nvrm_findings,
    _sxid_findings,
    _aer_findings,
    _ib_findings,
    _nccl_findings,
    _symptom_findings,
    _cuda_findings,
    _oom_findings,
    _dataloader_findings,
    _crash_findings,
)


def _valid(records: Iterable[Any]) -> list[LogRecord]:
    out = []
    for r in records:
        if isinstance(r, LogRecord) and isinstance(r.ts, datetime) and isinstance(r.kind, str):
            out.append(r if isinstance(r.line, str) else replace(r, line=str(r.line or "")))
    return sorted(out, key=lambda r: (_ts(r), r.id))


def _merged(findings: list[Finding]) -> list[Finding]:
    """Findings that several rules made under one key (storage errors seen in a traceback and in a plain line)
    become one: the most confident one's claim, with every rule's evidence."""
    by_key: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_key[f.key].append(f)
    out: list[Finding] = []
    for f in findings:
        same = by_key.get(f.key)
        if not same:
            continue  # already merged into the first of its key
        del by_key[f.key]
        if len(same) == 1:
            out.append(f)
            continue
        lead = max(same, key=lambda x: x.confidence)
        evidence = dict(lead.evidence)
        signals = [s for x in same for s in x.evidence.get("signals", [])]
        evidence["signals"] = list({s["id"]: s for s in signals}.values())[:MAX_SIGNALS]
        evidence["count"] = sum(int(x.evidence.get("count", 0)) for x in same)
        evidence["lines"] = list(dict.fromkeys(line for x in same for line in x.evidence.get("lines", [])))[:MAX_LINES]
        for name in ("nodes", "ranks"):
            values = sorted({v for x in same for v in x.evidence.get(name, [])})
            if values:
                evidence[name] = values[:MAX_LIST]
        out.append(replace(lead, observed_at=min(x.observed_at for x in same), evidence=evidence))
    return out


def _episode_key(finding: Finding) -> Finding:
    """The key the service stores a finding under: the rule's key, the claim (category, action) and the
    episode's time. A stronger claim about the same errors (more ranks: rollback instead of diagnose) and the
    same fault again after a restart are new findings; re-running over the same records is not. IB errors are
    stamped with their latest occurrence, so that each flap stores its own finding and the policy counts them."""
    stamp = finding.observed_at
    times = finding.evidence.get("times")
    if finding.key.startswith("ib:") and times:
        with contextlib.suppress(TypeError, ValueError):
            stamp = datetime.fromisoformat(times[-1])
    stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    key = f"{finding.key}:{finding.category}:{finding.action}@{stamp.astimezone(UTC):%Y%m%dT%H%M%S}"
    return replace(finding, key=key)


def detect(job: JobInfo, records: list[LogRecord], *, classify: Classify | None = None) -> list[Finding]:
    """Findings from a job's parsed log events; `classify` reads the lines no rule knows (optional)."""
    try:
        valid = _valid(records or [])
        ctx = _job_context(job, valid)
        occs = _occurrences(valid)
    except Exception:
        _log.warning("signatures: cannot read the records", exc_info=True)
        return []
    findings: list[Finding] = []
    for rule in _RULES:
        try:
            findings += rule(occs, ctx)
        except Exception:  # one rule's bug must not hide the others' findings
            _log.warning("signatures rule %s failed", rule.__name__, exc_info=True)
    try:
        tb_findings, unknown = _traceback_findings(occs, ctx, classify)
        findings += tb_findings
        findings += _unmatched_findings(occs, unknown, ctx, classify)
    except Exception:
        _log.warning("signatures: traceback rules failed", exc_info=True)
    return [_episode_key(f) for f in _merged(findings)]
