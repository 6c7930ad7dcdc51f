"""Lines no rule knows: filesystem and hardware words first, then the learned classifier's reading (diagnose
at most)."""

from __future__ import annotations

import math
from collections import defaultdict

from ml.findings import Finding
from ml.normalize import signature
from ml.signatures.common import (
    _HARDWARE_WORDS,
    MIN_CLASSIFIER_P,
    Classify,
    _finding,
    _group,
    _Job,
    _log,
    _Occ,
    storage_kind,
)
from ml.signatures.runtime import _storage_finding
from ml.signatures.tracebacks import _exc_text, _hardware_word_finding

_CLASSIFIED_NODE = frozenset({"gpu_hardware", "network", "storage"})
_CLASSIFIED_JOB = frozenset({"user_code", "oom", "nan"})


def _unmatched_findings(
    occs: list[_Occ], unknown_tbs: list[_Occ], job: _Job, classify: Classify | None
) -> list[Finding]:
    lines = [o for o in occs if o.kind == "unmatched_error"]
    findings: list[Finding] = []
    storage = [o for o in lines if storage_kind(o.record.line)]
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
