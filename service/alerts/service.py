"""Store Alertmanager alerts as log events, so the rules a cluster already has feed diagnosis.

Each alert (one fingerprint and start time) is one row of `log_events` with source "alertmanager": kind "xid"
when it carries an Xid code, shaped like the agent's kernel Xid events so that the Xid rules judge it the same
way; kind "alert" otherwise, read by ml/alerts.py. Alertmanager repeats a firing alert on every group interval:
the repeats are duplicates, and its "resolved" notification marks the stored row resolved.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote_plus, urlsplit

from sqlalchemy import and_, select, text, type_coerce, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.orm import Session

from ml import xid
from ml.alerts import KIND, SOURCE, severity_of, words
from service.alerts.schemas import Alert, AlertmanagerPayload, AlertsResult, IgnoredAlert
from service.db import after_commit
from service.errors import Forbidden
from service.models import Job, LogEvent, Node
from service.nodes.service import ensure_nodes
from service.security import Principal

# Where the machine is named, most specific first: dcgm-exporter's Hostname (both spellings), then the
# usual relabelings, then the scrape target (host:port).
NODE_LABELS = ("Hostname", "hostname", "node", "nodename", "kubernetes_node", "instance")
# The training job, when the alert rule knows it. Not `job`: that is Prometheus' scrape job.
JOB_LABELS = ("faultline_job", "training_job")
XID_LABELS = ("xid", "err_code", "XID")
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
GPU_LABELS = ("gpu", "GPU", "gpu_index")
# Xid rule severities (ml/xid.py) as log severities, for Xid alerts without a severity label.
_XID_SEVERITY = {"fatal": "critical", "informational": "warning"}
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$")
# Deterministic batch ids: the same alert always gets the same one.
_BATCH_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "faultline:alertmanager")
_LINE_CHARS = 4000
_NO_NODE = f"no node label ({', '.join(NODE_LABELS)})"


@dataclass(slots=True)
class _Row:
    alert: Alert
    node: str
    kind: str
    severity: str | None
    job_label: str | None
    values: dict[str, Any]


def node_of(labels: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(node name, None) from the first node label present, or (None, why not)."""
    for key in NODE_LABELS:
        raw = (labels.get(key) or "").strip()
        if not raw:
            continue
        host = _host(raw)
        if host and _NODE_NAME.match(host) and len(host) <= 253:
            return host, None
        return None, f"label {key}={raw!r} is not a valid node name"
    return None, _NO_NODE


def _host(value: str) -> str:
    """The host of "host", "host:port", "[v6]:port" or a URL (a blackbox probe's instance)."""
    if "://" in value:
        return urlsplit(value).hostname or ""
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _code(value: Any) -> int | None:
    """An Xid code from a label or a sample value ("79", "79.0"); None for anything else, 0 included."""
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number != int(number) or not 0 < number < 100_000:
        return None
    return int(number)


def xid_code(alert: Alert) -> int | None:
    """The Xid an alert reports: an xid/err_code label, or the value of a DCGM_FI_DEV_XID_ERRORS alert."""
    for key in XID_LABELS:
        if key in alert.labels:
            code = _code(alert.labels[key])
            if code is not None:
                return code
    value = alert.labels.get("value") or alert.annotations.get("value")
    if value is None:
        return None
    texts = [unquote_plus(alert.generator_url), *alert.labels.values(), *alert.annotations.values()]
    about_xid = any(XID_METRIC in t for t in texts) or "xid" in words(alert.labels.get("alertname", "")).split()
    return _code(value) if about_xid else None


def _pci(value: str | None) -> str | None:
    """dcgm-exporter's pci_bus_id ("00000000:3B:00.0") as the kernel's Xid lines name a GPU ("0000:3b:00")."""
    m = _PCI.match((value or "").strip())
    if not m:
        return None
    domain = (m.group(1) or "0").rjust(4, "0")[-4:]
    return f"{domain}:{m.group(2)}:{m.group(3)}".lower()


def _first(labels: Mapping[str, str], keys: Iterable[str]) -> str | None:
    return next((labels[k] for k in keys if labels.get(k)), None)


def _clip(text_: str, limit: int = _LINE_CHARS) -> str:
    return text_ if len(text_) <= limit else text_[: limit - 3] + "..."


def _row(alert: Alert, node: str, payload: AlertmanagerPayload, now: datetime) -> _Row:
    labels, annotations = alert.labels, alert.annotations
    alertname = labels.get("alertname", "")
    gpu = _first(labels, GPU_LABELS)
    pci = _pci(labels.get("pci_bus_id") or labels.get("PCI_BUS_ID"))
    ended = alert.ended_at
    fields: dict[str, Any] = {
        "fingerprint": alert.fingerprint,
        "alertname": alertname,
        "status": alert.status,
        "starts_at": alert.starts_at.isoformat(),
        "ends_at": ended.isoformat() if ended else None,
        "labels": labels,
        "annotations": annotations,
        "generator_url": alert.generator_url or None,
        "receiver": payload.receiver or None,
        "group_key": payload.group_key or None,
        "external_url": payload.external_url or None,
        "received_at": now.isoformat(),
    }
    summary = annotations.get("summary") or annotations.get("description") or annotations.get("message") or ""
    if annotations.get("summary"):
        fields["summary"] = annotations["summary"]
    if annotations.get("description"):
        fields["description"] = annotations["description"]
    if gpu is not None:
        fields["gpu"] = gpu
    for key, label in (("gpu_uuid", "UUID"), ("gpu_model", "modelName")):
        if labels.get(label):
            fields[key] = labels[label]
    where = f"{node} GPU {gpu}" if gpu is not None else node
    severity = severity_of(labels.get("severity"))
    code = xid_code(alert)
    if code is not None:
        entry = xid.lookup(code)
        message = labels.get("err_msg") or summary or entry.description or ""
        # The same fields the agent's kernel parser gives an Xid line (agents/parsers/kernel.py).
        fields.update(
            {
                "xid": code,
                "pci": pci,
                "pid": None,
                "process": None,
                "message": message,
                "mnemonic": entry.mnemonic or None,
                "action": entry.immediate_action or None,
            }
        )
        severity = severity or _XID_SEVERITY.get(entry.severity, "error")
        line = f"Alertmanager {alertname or 'alert'} {alert.status} on {where}: Xid {code} ({entry.name})"
        if message and message != entry.name:
            line += f": {message}"
        kind = "xid"
    else:
        if pci is not None:
            fields["pci"] = pci
        line = f"Alertmanager {alertname or 'alert'} {alert.status} on {where}" + (f" [{severity}]" if severity else "")
        if summary:
            line += f": {summary}"
        kind = KIND
    values = {
        "batch_id": uuid.uuid5(_BATCH_NAMESPACE, f"{alert.fingerprint}|{alert.starts_at.isoformat()}"),
        "ts": alert.starts_at,
        "source": SOURCE,
        "kind": kind,
        "severity": severity,
        "line": _clip(line),
        "fields": fields,
    }
    return _Row(alert, node, kind, severity, _first(labels, JOB_LABELS), values)


def store_alerts(
    session: Session,
    *,
    payload: AlertmanagerPayload,
    principal: Principal | None = None,
    now: datetime,
    on_urgent: Callable[[set[str]], None] | None = None,
) -> AlertsResult:
    """Store a notification's alerts (idempotent per fingerprint and start time); `on_urgent` gets the jobs
    to diagnose at once (firing critical or Xid alerts on a node that runs a job), after the commit."""
    result = AlertsResult(received=len(payload.alerts), stored=0, duplicates=0, resolved=0, ignored=0)
    # One alert per fingerprint and start; a resolved copy wins over a firing one.
    unique: dict[tuple[str, datetime], tuple[Alert, str]] = {}
    for alert in payload.alerts:
        node, why = node_of(alert.labels)
        if node is None:
            # log_events.node_id is required: an alert about no machine cannot be stored.
            result.ignored_alerts.append(IgnoredAlert(fingerprint=alert.fingerprint, reason=why or _NO_NODE))
            continue
        key = (alert.fingerprint, alert.starts_at)
        if key in unique:
            result.duplicates += 1
            if alert.status != "resolved":
                continue
        unique[key] = (alert, node)
    result.ignored = len(result.ignored_alerts)
    bound = principal.node_name if principal is not None else None
    if bound is not None:
        others = sorted({node for _, node in unique.values() if node != bound})
        if others:
            raise Forbidden(f"this token may only post alerts about node {bound!r}, not {', '.join(others)}")
    if not unique:
        return result

    rows = [_row(alert, node, payload, now) for alert, node in unique.values()]
    node_ids = ensure_nodes(session, names={r.node for r in rows})
    current = dict(session.execute(select(Node.id, Node.current_job_id).where(Node.id.in_(node_ids.values()))).all())
    job_ids = _job_ids(session, labeled={r.job_label for r in rows if r.job_label}, ids=set(current.values()))
    for r in rows:
        job_id = job_ids.by_name.get(r.job_label) if r.job_label else None
        r.values["node_id"] = node_ids[r.node]
        r.values["job_id"] = job_id if job_id is not None else current.get(node_ids[r.node])

    inserted = set(
        session.scalars(
            insert(LogEvent)
            .values([r.values for r in rows])
            .on_conflict_do_nothing(
                index_elements=[text("(fields ->> 'fingerprint')"), "ts"],
                index_where=text("source = 'alertmanager'"),
            )
            .returning(LogEvent.batch_id)
        )
    )
    urgent: set[str] = set()
    for r in rows:
        if r.values["batch_id"] in inserted:
            result.stored += 1
            if r.alert.status == "firing" and (r.kind == "xid" or r.severity == "critical"):
                job = job_ids.by_id.get(r.values["job_id"])
                if job is not None:
                    urgent.add(job)
        elif r.alert.status == "resolved" and _mark_resolved(session, alert=r.alert, node_id=r.values["node_id"]):
            result.resolved += 1
        else:
            result.duplicates += 1
    result.diagnosing = sorted(urgent)
    if urgent and on_urgent is not None:
        after_commit(session, lambda: on_urgent(urgent))
    return result


@dataclass(slots=True)
class _Jobs:
    by_name: dict[str, int]
    by_id: dict[int, str]


def _job_ids(session: Session, *, labeled: set[str], ids: set[int | None]) -> _Jobs:
    """Jobs the alerts name (existing ones only) and the jobs their nodes run, both ways round."""
    known = {i for i in ids if i is not None}
    if not labeled and not known:
        return _Jobs({}, {})
    rows = session.execute(select(Job.id, Job.external_id).where((Job.external_id.in_(labeled)) | (Job.id.in_(known))))
    jobs = _Jobs({}, {})
    for job_id, name in rows:
        jobs.by_name[name] = job_id
        jobs.by_id[job_id] = name
    return jobs


def _mark_resolved(session: Session, *, alert: Alert, node_id: int) -> bool:
    """Mark a stored firing alert of this node resolved; False when it was resolved already. By node too, so a
    token bound to one node cannot resolve another node's alert by its fingerprint."""
    ended = alert.ended_at
    patch = {"status": "resolved", "ends_at": ended.isoformat() if ended else None}
    updated = session.execute(
        update(LogEvent)
        .where(
            and_(
                LogEvent.source == SOURCE,
                LogEvent.fields["fingerprint"].astext == alert.fingerprint,
                LogEvent.ts == alert.starts_at,
                LogEvent.node_id == node_id,
                LogEvent.fields["status"].astext == "firing",
            )
        )
        .values(fields=LogEvent.fields.op("||")(type_coerce(patch, JSONB)))
        .returning(LogEvent.id)
        .execution_options(synchronize_session=False)
    ).first()
    return updated is not None
