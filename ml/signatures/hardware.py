"""Hardware rules: Xid (read through the catalog in ml/xid.py), the NVIDIA driver's failures that are no Xid (GSP
timeouts, a GPU it cannot initialize), NVSwitch SXid and the fabric manager, and PCIe AER."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ml.findings import Finding
from ml.signatures.common import MAX_LINES, _clip, _finding, _group, _Job, _Occ, _ts
from ml.xid import gpu_reset_recovers, lookup, recovery_required

# An Xid line as the kernel prints it, for events that arrive without parsed fields (another agent, a curl).
_XID_LINE = re.compile(r"\bXid\b\s*(?:\(([^)]*)\))?\s*:?\s*(\d+)\b")
# A GPU-resettable Xid that comes back after this long a quiet spell is a new fault (the GPU was reset in
# between, or should have been): its own finding, so a repeat on a reset GPU can escalate to an eviction.
RESET_BURST_GAP_S = 120.0
# Xid 45 (the driver tore the channels down) names the Xid that caused it; events without the parsed field.
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")


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
        if code == 45:
            findings += _xid45_findings(node, group, job)
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


def _cause_of(o: _Occ) -> int | None:
    """The Xid an Xid 45 says caused it ("... caused by previous Xid 149"), if a fatal one."""
    cause = o.fields.get("caused_by_xid")
    if not isinstance(cause, int) or isinstance(cause, bool):
        m = _CAUSED_BY.search(str(o.fields.get("message") or o.record.line))
        cause = int(m.group(1)) if m else None
    return cause if cause is not None and lookup(cause).severity == "fatal" else None


def _xid45_findings(node: str, group: list[_Occ], job: _Job) -> list[Finding]:
    """Xid 45 is the driver cleaning up after another fault. After a fatal one (an NVLink5 error, a GSP timeout)
    it means what its cause means, even where the cause's own line is not in the log (a log cut, another source):
    the driver names the cause, and the ranks' work was killed by it. After anything else it stays a symptom."""
    caused = [o for o in group if _cause_of(o) is not None]
    findings: list[Finding] = []
    rest = [o for o in group if _cause_of(o) is None]
    if rest:
        finding = _xid_finding(node, 45, rest, job)
        if finding is not None:
            findings.append(finding)
    if not caused:
        return findings
    causes = sorted({c for o in caused if (c := _cause_of(o)) is not None})
    lead = max((lookup(c) for c in causes), key=lambda e: (e.action == "evict", e.confidence))
    finding = _xid_finding(node, 45, caused, job, key_suffix=">" + "+".join(map(str, causes)))
    if finding is None:
        return findings
    names = ", ".join(f"{c} ({lookup(c).name})" for c in causes)
    details = dict(finding.evidence)
    details["caused_by_xids"] = causes
    details["gpu_reset_enough"] = all(lookup(c).gpu_reset_enough for c in causes)
    findings.append(
        replace(
            finding,
            category=lead.category,
            action=lead.action,
            blame=lead.blame,
            role="cause",
            # A step removed from the cause's own line: a little less sure than the cause itself.
            confidence=round(max(0.0, lead.confidence - 0.05), 3),
            summary=_clip(f"{finding.summary}, caused by Xid {names}", 300),
            evidence=details,
        )
    )
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


# The driver's failures that are no Xid, by form (agents/parsers/kernel.py's `failure` field; read from the text
# for events without it), as (form, pattern, action, confidence, reset_enough, words). Most severe first: a GPU's
# finding takes its most severe form's claim. `reset_enough`: the driver itself says a reset of that GPU clears it
# (it timed out on GSP RPCs, it marked the GPU for reset), as the catalog says of Xid 119; a GPU it cannot
# initialize (GSP firmware cannot boot, RmInitAdapter failed) is missing from NVML, so nothing can reset it
# through it: the machine reboots.
_NVRM_FORMS: tuple[tuple[str, re.Pattern[str], str, float, bool, str], ...] = (
    (
        "gsp_reset_required",
        re.compile(r"GPU marked for reset|NV_ERR_RESET_REQUIRED"),
        "evict",
        0.9,
        True,
        "GSP timeouts: the driver marked the GPU for reset",
    ),
    ("gsp_rpc_timeout", re.compile(r"\bGSP Timeout\b|rpcRecvPoll timedout"), "evict", 0.85, True, "GSP RPC timeout"),
    (
        "gsp_boot_failed",
        re.compile(r"WPR2 already up|Cannot initialize GSP firmware|likely in a bad state and may need to be reset"),
        "evict",
        0.85,
        False,
        "GSP firmware cannot boot",
    ),
    (
        "init_failed",
        re.compile(r"(?i)RmInitAdapter failed|rm_init_adapter failed"),
        "evict",
        0.85,
        False,
        "the NVIDIA driver cannot initialize the GPU",
    ),
    # The driver could not bring an NVLink up or read its state ("knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's
    # postRxDetLinkMask failed!"): the GPU runs without its NVLinks until the machine is rebooted (leptonai/gpud#1272
    # recommends a reboot); the checks confirm it.
    (
        "nvlink_failed",
        re.compile(r"\bknvlink\w*:.*\b(?:[Ff]ail(?:ed|ure)?|timed out|[Tt]imeout)\b"),
        "diagnose",
        0.7,
        False,
        "the driver could not bring up an NVLink",
    ),
    # Alone, a GSP heartbeat that did not advance is often noise (stuck at 0 on some desktops for months,
    # NVIDIA/open-gpu-kernel-modules#1064); with an RPC timeout it is that timeout's first sign.
    ("gsp_heartbeat", re.compile(r"[Hh]eartbeat timed out"), "diagnose", 0.6, True, "GSP heartbeat timed out"),
    (
        "gpu_lost",
        re.compile(r"(?i)GPU is lost|unable to communicate with"),
        "diagnose",
        0.6,
        False,
        "the NVIDIA driver lost the GPU",
    ),
)
_FORM_RANK = {form[0]: i for i, form in enumerate(_NVRM_FORMS)}
_NVLINK_FORMS = frozenset({"nvlink_failed"})  # a finding led by one of these is the NVLink's, not the GPU's


def _nvrm_form(o: _Occ) -> str | None:
    """The failure an NVRM line says (a `_NVRM_FORMS` name), or None; the fallen-off-bus line is the Xid rule's."""
    if o.kind != "nvrm" or _xid_code(o) is not None:
        return None
    form = o.fields.get("failure")
    if isinstance(form, str) and form in _FORM_RANK:
        return form
    text = str(o.fields.get("message") or o.record.line)
    return next((name for name, pattern, *_ in _NVRM_FORMS if pattern.search(text)), None)


def _driver_gpu(o: _Occ) -> int | None:
    """The driver's own number of the GPU ("GPU6 _kgspBootGspRm: ..."), which need not be nvidia-smi's index."""
    gpu = o.fields.get("gpu_index")
    if isinstance(gpu, int) and not isinstance(gpu, bool):
        return gpu
    m = re.match(r"(?:.*NVRM: )?GPU(\d{1,3}) ", str(o.fields.get("message") or o.record.line))
    return int(m.group(1)) if m else None


def _by_gpu(failures: list[_Occ], xids: list[_Occ]) -> dict[str, list[_Occ]]:
    """One node's failures by GPU: its PCI address, else "GPU<n>" by the driver's number; "" for lines that name
    no GPU.

    One node's lines name one failing GPU in two ways ("GPU 0000:a1:00.0: RmInitAdapter failed", "GPU6
    _kgspBootGspRm: ..."), and some lines none ("Back to back GSP RPC timeout detected! GPU marked for reset"):
    where only one GPU is named, by its failures or by the node's Xids around them, every line is that GPU's."""
    keys: dict[int, str] = {}
    pcis = {p for o in failures if (p := _pci(o))}
    numbers = {n for o in failures if (n := _driver_gpu(o)) is not None and not _pci(o)}
    for o in failures:
        number = _driver_gpu(o)
        keys[id(o)] = _pci(o) or (f"GPU{number}" if number is not None else "")
    if len(numbers) == 1 and len(pcis) == 1:
        pci = next(iter(pcis))
        keys = {k: pci if v.startswith("GPU") else v for k, v in keys.items()}
    unnamed = [o for o in failures if not keys[id(o)]]
    if unnamed:
        first, last = min(_ts(o.record) for o in unnamed), max(_ts(o.record) for o in unnamed)
        near = {
            p
            for o in xids
            if (p := _pci(o))
            and (_ts(o.record) - first).total_seconds() >= -RESET_BURST_GAP_S
            and (_ts(o.record) - last).total_seconds() <= RESET_BURST_GAP_S
        }
        named = {v for v in keys.values() if v}
        if len(named | near) == 1:
            only = next(iter(named | near))
            keys.update({id(o): only for o in unnamed})
    return _group(failures, lambda o: keys[id(o)])


def _nvrm_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """The driver saying a GPU failed without an Xid: GSP firmware timeouts and boot failures, a GPU it cannot
    initialize. One finding per GPU and episode (a burst of lines, RESET_BURST_GAP_S apart at most)."""
    failures = [o for o in occs if _nvrm_form(o) is not None]
    findings: list[Finding] = []
    for node, on_node in sorted(_group(failures, lambda o: o.node).items()):
        xids = [o for o in occs if o.node == node and o.kind == "xid"]
        for gpu, group in sorted(_by_gpu(on_node, xids).items()):
            for burst in _bursts(group):
                findings.append(_nvrm_finding(node, gpu, burst, job))
    return findings


def _nvrm_finding(node: str, gpu: str, burst: list[_Occ], job: _Job) -> Finding:
    forms = sorted({f for o in burst if (f := _nvrm_form(o))}, key=_FORM_RANK.__getitem__)
    claims = [_NVRM_FORMS[_FORM_RANK[f]] for f in forms]
    _, _, action, confidence, _, words = claims[0]
    # A reset is enough only if every form says so: one that needs a reboot decides for the GPU.
    reset_enough = all(c[4] for c in claims)
    pci = gpu if gpu and not gpu.startswith("GPU") else None
    where = f"{node} GPU {pci}" if pci else f"{node} {gpu}" if gpu else node
    what = "a GPU reset clears it" if reset_enough else "the machine needs a reboot"
    summary = f"{words} on {where}" + (f": {what}" if action == "evict" else "")
    return _finding(
        burst,
        key=f"nvrm:{node}:{gpu or '-'}~{int(_ts(burst[0].record).timestamp())}",
        category="nvlink" if forms[0] in _NVLINK_FORMS else "gpu_hardware",
        confidence=confidence,
        summary=summary,
        node=node,
        subject_kind="gpu" if pci else "node",
        subject=f"{node}/{pci}" if pci else node,
        job=job,
        blame="infrastructure",
        action=action,
        sig_text=f"nvrm {' '.join(forms)}",
        failures=forms,
        gsp=any(f.startswith("gsp_") for f in forms),
        gpu_reset_enough=reset_enough,
        pci=[pci] if pci else None,
        driver_gpus=sorted({n for o in burst if (n := _driver_gpu(o)) is not None}) or None,
    )


def _sxid_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """The NVSwitch fabric's two voices: the switches' own errors (SXid) and the fabric manager's failures."""
    groups = _group((o for o in occs if o.kind == "sxid"), lambda o: (o.node, o.fields.get("sxid")))
    findings = _fabric_manager_findings(occs, job)
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


def _fabric_manager_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """A fabric manager that cannot start (its kernel module missing, say): the node's GPUs never join the NVLink
    fabric, so NCCL and CUDA fail on it, a fault of that node's set-up to diagnose. Its exits alone say nothing (on
    a machine without NVSwitches it exits with NV_WARN_NOTHING_TO_DO, harmlessly), nor does that warning."""
    failed = (
        o
        for o in occs
        if o.kind == "fabric_manager" and (o.fields.get("state") == "cannot_start" or o.record.severity == "error")
    )
    findings = []
    for node, group in sorted(_group(failed, lambda o: o.node).items()):
        reason = str(group[0].fields.get("message") or group[0].record.line).strip()
        findings.append(
            _finding(
                group,
                key=f"fabric_manager:{node}",
                category="nvlink",
                confidence=0.7,
                summary=f"fabric manager cannot start on {node}, its GPUs are off the NVLink fabric: {reason}",
                node=node,
                job=job,
                blame="infrastructure",
                action="diagnose",
                sig_text="fabric manager cannot start",
            )
        )
    return findings


# Corrected AER errors on a node with no error of its own make a finding from this many in the window.
CORRECTED_AER_FLOOD = 5
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
    # Nodes with trouble of their own beside the AER lines: a corrected error there may be part of the failure.
    failing = {o.node for o in occs if o.kind != "pcie_aer" and o.record.severity in ("warning", "error", "critical")}
    findings = []
    for (node, device, severity), group in sorted(groups.items()):
        confidence, action = _AER_LEVEL.get(severity, (0.25, "diagnose"))
        if severity == "corrected" and len(group) < CORRECTED_AER_FLOOD and node not in failing:
            continue  # the hardware corrected it: a few on a working node are routine (a laptop's, a busy link's)
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


def _edac_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """Uncorrected host memory errors the memory controllers logged (EDAC): the node's DIMM, as the EDAC counters'
    rule says it from the node's metrics (ml/node_signals.py). Corrected ones are routine at a low rate: none."""
    groups = _group((o for o in occs if o.kind == "edac" and o.fields.get("uncorrected")), lambda o: o.node)
    findings = []
    for node, group in sorted(groups.items()):
        total = sum(int(o.fields.get("count") or 1) for o in group)
        where = sorted({str(o.fields["location"]) for o in group if o.fields.get("location")})
        findings.append(
            _finding(
                group,
                key=f"edac:{node}",
                category="host",
                confidence=0.85,
                summary=f"{total} uncorrected host memory error{'s' * (total != 1)} on {node}"
                + (f" ({', '.join(where[:3])})" if where else ""),
                node=node,
                job=job,
                blame="infrastructure",
                action="evict",
                sig_text="edac uncorrected",
                uncorrected_errors=total,
                dimms=where or None,
            )
        )
    return findings
