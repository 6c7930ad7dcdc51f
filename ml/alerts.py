"""Alertmanager alerts (the rules a cluster already has) into findings on the machine they name.

The service stores every alert as a log event with source "alertmanager": alerts that carry an Xid code as kind
"xid", read by the Xid rules in ml/signatures/hardware.py exactly like a kernel Xid line; all others as kind "alert",
read here. A firing alert becomes a cause on its node (or GPU). Its category comes from a `faultline_category`
label, else from words in its name and annotations, else from the log classifier; its confidence from its
severity. An alert rule alone never evicts: it asks for diagnostics at most. Resolved alerts add nothing.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ml.findings import CATEGORIES, AlertEvidence, Finding, JobInfo, LogRecord
from ml.normalize import signature

DETECTOR = "alerts"
SOURCE = "alertmanager"
KIND = "alert"
MAX_SIGNALS = 50
MAX_LIST = 64
MIN_CLASSIFIER_P = 0.5

Classify = Callable[[list[str]], list[tuple[str, float]]]

_log = logging.getLogger(__name__)

# Alert severity -> the finding's confidence; "info" alerts make no finding.
CONFIDENCE = {"critical": 0.7, "error": 0.6, "warning": 0.5}
# The spellings alert rules use, by the severity faultline reads them as.
_SEVERITY_WORDS = {
    "critical": ("critical", "crit", "page", "fatal", "emergency", "emerg", "high", "disaster", "p1", "sev1"),
    "error": ("error", "err", "major", "p2", "sev2"),
    "warning": ("warning", "warn", "minor", "medium", "average", "p3", "sev3"),
    "info": ("info", "informational", "information", "notice", "low", "none", "debug", "ok", "p4", "p5", "sev4"),
}
_SEVERITY = {word: level for level, words in _SEVERITY_WORDS.items() for word in words}

# Categories whose cause is the machine, not the job: blamed on infrastructure.
_INFRASTRUCTURE = frozenset({"gpu_hardware", "nvlink", "pcie", "network"})
# A node that is down or unreachable has no category of its own: "unknown", blamed on infrastructure.
NODE_DOWN = "node_down"

# Rules over the alert's words (camelCase split, lower case), most specific first: "NVLinkDown" is NVLink,
# not a link; "GPUNodeDown" is a node down and "GPUOutOfMemory" an OOM, not a GPU fault.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "gpu_hardware",
        re.compile(
            r"\b(?:xid|ecc|dbe|sbe|row ?remap\w*|remapp\w*|retired pages?|page retire\w*|fallen off|off the bus"
            r"|thermal\w*|temperature|temp|overheat\w*|throttl\w*|hbm|gpu (?:is )?lost|lost gpu|gpu reset)\b"
        ),
    ),
    ("nvlink", re.compile(r"\b(?:nv ?link\w*|nv ?switch\w*|sxid|fabric ?manager)\b")),
    ("pcie", re.compile(r"\b(?:pcie?|aer)\b")),
    (
        "network",
        re.compile(
            r"\b(?:infini ?band|ib|rdma|roce|rocev2|nic|nics|hca|mlx\w*|pfc|ecn|ethernet|network|bond\w*"
            r"|link (?:down|flap\w*|err\w*|state|fail\w*|degraded|lost)|links? down|port (?:down|flap\w*|err\w*)"
            r"|packet loss|carrier)\b"
        ),
    ),
    (
        "storage",
        re.compile(
            r"\b(?:disk|disks|filesystem|file ?system|fs|nfs|lustre|gpfs|beegfs|weka|mount\w*|inodes?|volume"
            r"|raid|nvme|i ?o errors?|read ?only)\b"
        ),
    ),
    # Out of memory is the job's size or the host's, not a broken part; it names no hardware either.
    ("oom", re.compile(r"\b(?:oom\w*|out of memory|memory pressure)\b")),
    (
        NODE_DOWN,
        re.compile(
            r"\b(?:(?<!slow )(?<!scale )(?<!scaled )(?<!ramp )down|unreachable|not ?ready|offline|unresponsive"
            r"|no heartbeat|heartbeat (?:lost|missing|missed|timeout)|absent|(?:node|host|instance) lost"
            r"|probe fail\w*)\b"
        ),
    ),
    ("gpu_hardware", re.compile(r"\b(?:gpu|gpus|dcgm|nvidia)\b")),
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[_\-:./]+")


def severity_of(value: Any) -> str | None:
    """An alert's `severity` label as critical, error, warning or info; None when absent or unknown."""
    if not isinstance(value, str):
        return None
    return _SEVERITY.get(value.strip().lower())


def words(text: str) -> str:
    """Alert names and annotations as plain lower-case words: "DCGMGpuXidError" -> "dcgm gpu xid error"."""
    spaced = _CAMEL.sub(" ", text)
    return " ".join(_SEPARATORS.sub(" ", spaced).lower().split())


def category_by_rules(text: str) -> str | None:
    """The category the alert's words name (NODE_DOWN for a machine down), None when no rule matches."""
    plain = words(text)
    for category, pattern in _RULES:
        if pattern.search(plain):
            return category
    return None


def alert_text(fields: Mapping[str, Any]) -> str:
    """What the alert says: its name, summary and description."""
    annotations = _mapping(fields.get("annotations"))
    parts = [
        fields.get("alertname"),
        annotations.get("summary") or fields.get("summary"),
        annotations.get("description") or fields.get("description"),
        annotations.get("message"),
    ]
    return " ".join(str(p) for p in parts if p)


@dataclass(slots=True)
class _Alert:
    record: LogRecord
    fields: Mapping[str, Any]
    alertname: str
    severity: str
    gpu: str | None
    text: str
    category: str = "unknown"
    origin: str = "default"  # where the category came from: label, rules, classifier or default
    probability: float | None = None
    node_down: bool = False

    @property
    def ts(self) -> datetime:
        ts = self.record.ts
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _firing(records: Iterable[Any]) -> list[_Alert]:
    """The firing alerts worth a finding (severity above info), in time order."""
    out: list[_Alert] = []
    for r in records:
        if not isinstance(r, LogRecord) or r.kind != KIND or r.source != SOURCE or not r.node:
            continue
        if not isinstance(r.ts, datetime):
            continue
        fields = _mapping(r.fields)
        if fields.get("status") != "firing":
            continue  # resolved: the condition is gone, and its finding (if any) is already stored
        labels = _mapping(fields.get("labels"))
        severity = severity_of(labels.get("severity")) or severity_of(r.severity) or "warning"
        if severity not in CONFIDENCE:
            continue  # info: nothing to do
        alertname = str(fields.get("alertname") or labels.get("alertname") or "alert")
        gpu = fields.get("gpu")
        out.append(
            _Alert(
                record=r,
                fields=fields,
                alertname=alertname,
                severity=severity,
                gpu=str(gpu) if gpu is not None and str(gpu) != "" else None,
                text=alert_text({**fields, "alertname": alertname}),
            )
        )
    return sorted(out, key=lambda a: (a.ts, a.record.id))


def _categorize(alerts: list[_Alert], classify: Classify | None) -> None:
    """Set each alert's category: its label, else the rules, else the classifier, else unknown."""
    unread: list[_Alert] = []
    for a in alerts:
        label = str(_mapping(a.fields.get("labels")).get("faultline_category") or "").strip().lower()
        if label in CATEGORIES:
            a.category, a.origin = label, "label"
            continue
        by_rules = category_by_rules(a.text)
        if by_rules == NODE_DOWN:
            a.category, a.origin, a.node_down = "unknown", "rules", True
        elif by_rules is not None:
            a.category, a.origin = by_rules, "rules"
        else:
            unread.append(a)
    if classify is None or not unread:
        return
    texts = sorted({a.text[:2000] for a in unread})
    try:
        answers = dict(zip(texts, classify(texts), strict=False))
    except Exception:  # a broken model must not hide the alerts the rules did read
        _log.warning("log classifier failed on alert texts", exc_info=True)
        return
    for a in unread:
        answer = answers.get(a.text[:2000])
        try:
            category, p = str(answer[0]), float(answer[1])  # type: ignore[index]
        except (TypeError, ValueError, IndexError):
            continue
        if category in CATEGORIES and category != "unknown" and math.isfinite(p) and p >= MIN_CLASSIFIER_P:
            a.category, a.origin, a.probability = category, "classifier", p


def _finding(node: str, group: Sequence[_Alert]) -> Finding:
    first = group[0]
    gpus = sorted({a.gpu for a in group if a.gpu is not None})
    one_gpu = len(gpus) == 1 and all(a.gpu is not None for a in group)
    where = f"{node} GPU {gpus[0]}" if one_gpu else node
    confidence = CONFIDENCE[first.severity]
    probabilities = [a.probability for a in group if a.probability is not None]
    if probabilities:
        confidence = min(confidence, max(probabilities))
    infrastructure = first.category in _INFRASTRUCTURE or first.node_down
    annotations = _mapping(first.fields.get("annotations"))
    summary = str(annotations.get("summary") or annotations.get("description") or "").strip()
    count = f" x{len(group)}" if len(group) > 1 else ""
    observed = min(a.ts for a in group)
    ordered = sorted(group, key=lambda a: (a.ts, a.record.id))
    evidence: AlertEvidence = {
        "signals": [{"type": "log", "id": a.record.id} for a in ordered[:MAX_SIGNALS]],
        "signature": signature(f"alert {first.alertname} {first.category}"),
        "lines": list(dict.fromkeys(a.record.line for a in ordered if a.record.line))[:3],
        "count": len(group),
        "nodes": [node],
        "alertname": first.alertname,
        "severity": first.severity,
        "fingerprints": sorted({str(a.fields.get("fingerprint")) for a in group if a.fields.get("fingerprint")})[
            :MAX_LIST
        ],
        "category_from": first.origin,
    }
    if gpus:
        evidence["gpus"] = gpus[:MAX_LIST]
    if summary:
        evidence["summary"] = summary[:500]
    if first.fields.get("generator_url"):
        evidence["generator_url"] = str(first.fields["generator_url"])
    if probabilities:
        evidence["classifier_probability"] = round(max(probabilities), 3)
    if first.node_down:
        evidence["alert_class"] = NODE_DOWN
    key = f"alert:{node}:{first.alertname}:{first.severity}" + (f":{NODE_DOWN}" if first.node_down else "")
    return Finding(
        detector=DETECTOR,
        category=first.category,
        subject_kind="gpu" if one_gpu else "node",
        subject=f"{node}/{gpus[0]}" if one_gpu else node,
        confidence=round(confidence, 3),
        summary=(f"alert {first.alertname} ({first.severity}){count} on {where}" + (f": {summary}" if summary else ""))[
            :300
        ],
        observed_at=observed,
        node=node,
        blame="infrastructure" if infrastructure else "unknown",
        role="cause",
        action="diagnose",
        # The same alerts on a re-run give the same key; the same rule firing again later is a new episode.
        key=f"{key}:{first.category}:diagnose@{observed.astimezone(UTC):%Y%m%dT%H%M%S}",
        evidence=evidence,
    )


def detect(job: JobInfo, records: Sequence[LogRecord], *, classify: Classify | None = None) -> list[Finding]:
    """Findings from a job's firing Alertmanager alerts; `classify` reads alerts no rule knows (optional)."""
    try:
        alerts = _firing(records or [])
        _categorize(alerts, classify)
    except Exception:
        _log.warning("alerts: cannot read the records of job %s", job.job_id, exc_info=True)
        return []
    groups: dict[tuple[str, str, str, str, bool], list[_Alert]] = defaultdict(list)
    for a in alerts:
        groups[(a.record.node, a.alertname, a.severity, a.category, a.node_down)].append(a)
    findings: list[Finding] = []
    for (node, *_), group in sorted(groups.items(), key=lambda kv: kv[0]):
        try:
            findings.append(_finding(node, group))
        except Exception:
            _log.warning("alerts: cannot judge alert %s on %s", group[0].alertname, node, exc_info=True)
    return findings
