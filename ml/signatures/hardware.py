"""Hardware rules: Xid (read through the catalog in ml/xid.py), NVRM initialization failures, NVSwitch SXid and
PCIe AER."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ml.findings import Finding
from ml.signatures.common import MAX_LINES, _clip, _finding, _group, _Job, _Occ, _ts
from ml.xid import gpu_reset_recovers, lookup, recovery_required

# An Xid line as the kernel prints it, for events that arrive without parsed fields (another agent, a curl).
_XID_LINE = re.compile(r"\bXid\b\s*(?:\(([^)]*)\))?\s*:?\s*(\d+)\b")
# A GPU-resettable Xid that comes back after this long a quiet spell is a new fault (the GPU was reset in
# between, or should have been): its own finding, so a repeat on a reset GPU can escalate to an eviction.
RESET_BURST_GAP_S = 120.0


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
        if not lookup(code).gpu_reset_enough:
            bursts = [(group, "")]
        else:  # each burst keyed by its first occurrence, so a repeat after a quiet spell is a new finding
            bursts = [(b, f"~{int(_ts(b[0].record).timestamp())}") for b in _bursts(group)]
        for burst, suffix in bursts:
            finding = _xid_finding(node, code, burst, job, key_suffix=suffix)
            if finding is not None:
                findings.append(finding)
    return findings


def _bursts(group: list[_Occ]) -> list[list[_Occ]]:
    """Occurrences split where RESET_BURST_GAP_S passed without one, oldest first."""
    bursts: list[list[_Occ]] = []
    for o in sorted(group, key=lambda o: _ts(o.record)):
        if bursts and (_ts(o.record) - _ts(bursts[-1][-1].record)).total_seconds() <= RESET_BURST_GAP_S:
            bursts[-1].append(o)
        else:
            bursts.append([o])
    return bursts


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
        "gpu_reset_enough": entry.gpu_reset_enough,
        "pci": sorted({p for o in group if (p := _pci(o))}) or None,
        "processes": processes or None,
        "messages": messages or None,
    }


def _xid_finding(node: str, code: int, group: list[_Occ], job: _Job, *, key_suffix: str = "") -> Finding | None:
    entry = lookup(code)
    category, action, blame, confidence, role = (
        entry.category,
        entry.action,
        entry.blame,
        entry.confidence,
        "cause",
    )
    details = _xid_details(code, group)
    if code == 154:
        actions = [str(o.fields.get("recovery_action") or "") for o in group]
        if not any(recovery_required(a) for a in actions):
            return None  # informational: the recovery action went back to none
        category, action, blame, confidence = "gpu_hardware", "evict", "infrastructure", 0.9
        details["gpu_reset_enough"] = all(gpu_reset_recovers(a) for a in actions if recovery_required(a))
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
        key=f"xid:{node}:{code}{key_suffix}",
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
        **details,
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
