"""Runtime rules: CUDA errors (ECC vs. illegal memory access vs. the job's own), out of memory, data loader
workers and filesystem errors."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ml.findings import Finding
from ml.signatures.common import (
    _STORAGE_INFRA,
    MAX_LIST,
    _finding,
    _group,
    _Job,
    _Occ,
    _rank_note,
    _widespread,
)

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
_SHM = re.compile(r"(?i)shared memory|/dev/shm|\bshm\b")


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
    host = [o for o in group if o.fields.get("host") is True]  # DefaultCPUAllocator: the node's RAM, not a GPU's
    gpu = [o for o in group if o.fields.get("host") is not True]
    return [_oom_finding(g, job, what) for g, what in ((gpu, "GPU"), (host, "host")) if g]


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
                exit_signals=signals,
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
