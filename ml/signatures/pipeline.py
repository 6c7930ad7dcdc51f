"""The entry point: every rule family over a job's records in a fixed order, findings of one key merged, and
the episode key the service stores them under."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ml.findings import Finding, JobInfo, LogRecord
from ml.signatures.app_faults import application_faults
from ml.signatures.classified import _unmatched_findings
from ml.signatures.common import (
    MAX_LINES,
    MAX_LIST,
    MAX_SIGNALS,
    Classify,
    _Job,
    _job_context,
    _log,
    _Occ,
    _occurrences,
    _ts,
)
from ml.signatures.hardware import _aer_findings, _edac_findings, _nvrm_findings, _sxid_findings, _xid_findings
from ml.signatures.network import (
    _adapter_findings,
    _ib_findings,
    _ib_verbs_findings,
    _nccl_findings,
    _port_findings,
)
from ml.signatures.runtime import _cuda_findings, _dataloader_findings, _oom_findings
from ml.signatures.symptoms import _symptom_findings
from ml.signatures.tracebacks import _crash_findings, _traceback_findings

# The rules run in this order (tracebacks and unmatched lines last, in detect()); findings keep it.
_RULES: tuple[Callable[[list[_Occ], _Job], list[Finding]], ...] = (
    _xid_findings,
    _nvrm_findings,
    _sxid_findings,
    _aer_findings,
    _edac_findings,
    _ib_findings,
    _port_findings,
    _adapter_findings,
    _ib_verbs_findings,
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


# A user bug's crash, stamped with its latest occurrence, one series per bug: a job relaunched without the fix
# crashes on it again, and that crash is new evidence for the bug's open incident (its recovery counts from it), or
# a new incident once that one was resolved. Stamped with the first, the second crash stored nothing.
_CRASHES_AGAIN = ("traceback:user:", "crash:user:")


def _episode_key(finding: Finding) -> Finding:
    """The key the service stores a finding under: the rule's key, the claim (category, action) and the
    episode's time. A stronger claim about the same errors (more ranks: rollback instead of diagnose) and the
    same fault again after a restart are new findings; re-running over the same records is not. IB errors are
    stamped with their latest occurrence, so that each flap stores its own finding and the policy counts them; user
    bugs' crashes too (_CRASHES_AGAIN)."""
    stamp = finding.observed_at
    times = finding.evidence.get("times")
    again = finding.key.startswith(_CRASHES_AGAIN)
    if (finding.key.startswith("ib:") or again) and times:
        with contextlib.suppress(TypeError, ValueError):
            stamp = datetime.fromisoformat(times[-1])
    stamp = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).astimezone(UTC)
    claim = f"{finding.key}:{finding.category}:{finding.action}"
    key = f"{claim}@{stamp:%Y%m%dT%H%M%S}"
    if again:
        return replace(finding, key=key, series=claim, seen_until=stamp)
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
    try:
        findings = application_faults(findings, occs, ctx)
    except Exception:
        _log.warning("signatures: application-fault rule failed", exc_info=True)
    return [_episode_key(f) for f in _merged(findings)]
