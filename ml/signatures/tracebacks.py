"""Traceback and crash rules: the same exception on most ranks is the job's code, a victim's is a symptom, a
hardware word or a filesystem error goes to its own rule."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ml.findings import Finding
from ml.normalize import normalize, signature
from ml.signatures.common import (
    _HARDWARE_WORDS,
    Classify,
    _clip,
    _finding,
    _group,
    _Job,
    _Occ,
    _rank_note,
    _times,
    _widespread,
    storage_kind,
)
from ml.signatures.runtime import _oom_finding, _storage_finding

# What a victim of another rank's failure says (the peer died, the collective was aborted, a store timed out).
_VICTIM_WORDS = re.compile(
    r"(?i)Connection closed by (?:remote )?peer|remote worker crash|Connection reset by peer|Broken pipe"
    r"|communicator was aborted|ProcessGroup\w* .{0,40}abort|Socket Timeout|timed out|Timeout|watchdog"
    r"|remote process exited|ncclRemoteError|ncclSystemError|DistBackendError|DistNetworkError|DistStoreError"
    r"|RendezvousError|Rendezvous\w+Error|NCCL error|NCCL communicator"
    # a socket whose peer went away (c10d's store, Gloo); not a file system, unless a path follows (storage first)
    r"|Transport endpoint is not connected"
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
    # The parser's storage errors, on their own lines or read from a traceback's or a crash's message.
    storage: list[_Occ] = [o for o in occs if o.kind == "storage_error"]
    groups = _group(tbs, lambda o: _tb_signature_text(o, job.hosts))
    for sig_text, group in sorted(groups.items()):
        exc_type = str(group[0].fields.get("exc_type"))
        short = _short_type(exc_type)
        text = _exc_text(group[0])
        victim = short in _VICTIM_TYPES or bool(_VICTIM_WORDS.search(text))
        if storage_kind(text):
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
                    times=_times(group),
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
                    times=_times(group),
                )
            )
            continue
        unknown += group
    if storage:
        findings += _storage_finding(storage, job, lambda o: _exc_text(o) if o.kind == "traceback" else o.record.line)
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
    storage = [o for o in crashes if storage_kind(_crash_text(o))]
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
                    times=_times(group),
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
