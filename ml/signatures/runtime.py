"""Runtime rules: CUDA errors (ECC vs. illegal memory access vs. the job's own), out of memory, data loader
workers and filesystem errors."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ml.findings import Finding
from ml.signatures.common import (
    _STORAGE_CATEGORIES,
    MAX_LIST,
    _finding,
    _group,
    _Job,
    _Occ,
    _rank_note,
    _widespread,
    storage_kind,
)

# CUDA error names (agents/parsers/training/cuda.py) by what they usually mean.
# gpu_lost: NVML's "GPU is lost" (the parser's rule_gpu_lost), the GPU off the bus as Xid 79 says it.
_CUDA_HARDWARE = frozenset({"ecc_uncorrectable", "gpu_lost"})
_CUDA_NVLINK = frozenset({"nvlink_uncorrectable"})
_CUDA_DEVICE_GONE = frozenset({"no_device", "initialization_error", "unknown_error", "devices_unavailable"})
_CUDA_USER = frozenset(
    {"device_assert", "no_kernel_image", "invalid_device_ordinal", "invalid_argument", "stream_capture"}
)
_CUDA_OOM = frozenset({"out_of_memory"})
# A kernel that touched an unmapped address: the application's own bug about twice as often as the hardware's
# (ByteRobust), so the machine is suspected only with a hardware signal of its own (ILLEGAL_ADDRESS is the name the
# parser gives it, the one a cross-job check of the machine matches on).
ILLEGAL_ADDRESS = "illegal_memory_access"
_HARDWARE_CLASSES = frozenset({"hardware", "nvlink", "device_gone"})
_CUBLAS_USER = re.compile(r"(?:invalid_value|not_supported|not_initialized|bad_param|arch_mismatch|mapping_error)")
_ECC_WORDS = re.compile(r"(?i)uncorrectable|\bECC\b|double.bit")
_SHM = re.compile(r"(?i)shared memory|/dev/shm|\bshm\b")


def _cuda_class(o: _Occ) -> str:
    """hardware, nvlink, device_gone, user, oom or ambiguous."""
    name = str(o.fields.get("error") or "")
    message = str(o.fields.get("message") or "")
    if name in _CUDA_NVLINK:  # before the ECC words: "uncorrectable NVLink error" is the link's, not the memory's
        return "nvlink"
    if name in _CUDA_HARDWARE or _ECC_WORDS.search(message) or _ECC_WORDS.search(name):
        return "hardware"
    if name in _CUDA_OOM or "alloc_failed" in name:
        return "oom"
    if name in _CUDA_DEVICE_GONE:
        return "device_gone"
    if name == ILLEGAL_ADDRESS:
        return "illegal_address"
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
        elif cls == "illegal_address" and not _widespread(group, job):
            findings += _illegal_address_findings(group, _hardware_signal_nodes(occs), job)
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


def _hardware_signal_nodes(occs: Sequence[_Occ]) -> set[str]:
    """Machines with a hardware signal of their own in the records: a Xid, an SXid, an uncorrected PCIe error, an
    NVRM error, a CUDA error that names the hardware (ECC, NVLink, a device gone)."""
    nodes: set[str] = set()
    for o in occs:
        if (
            o.kind in ("xid", "sxid")
            or (o.kind == "pcie_aer" and str(o.fields.get("severity") or "corrected") != "corrected")
            or (o.kind == "nvrm" and o.record.severity in ("error", "critical"))
            or (o.kind == "cuda_error" and _cuda_class(o) in _HARDWARE_CLASSES)
        ):
            nodes.add(o.node)
    return nodes


def _repeated_elsewhere(group: Sequence[_Occ]) -> list[str]:
    """Where else the machine had the fault alone (the service marks the stored record, which a traceback's
    unwrapped error does not carry: read from the record)."""
    return sorted({str(e) for o in group for e in o.record.fields.get("repeated_elsewhere") or ()})


def _illegal_address_findings(group: Sequence[_Occ], hardware: set[str], job: _Job) -> list[Finding]:
    """An illegal memory access on few machines: the application's (restart it) where the machine shows no hardware
    signal; a suspect to diagnose where it does (app_faults pairs a Xid 31 with it), or where the machine had it
    alone under other jobs lately (the service marks such records `repeated_elsewhere`: service/diagnosis/repeats.py).
    """
    findings: list[Finding] = []
    for node, ngroup in sorted(_group(group, lambda o: o.node).items()):
        if node in hardware:
            findings.append(
                _finding(
                    ngroup,
                    key=f"cuda:ambiguous:{node}",
                    category="unknown",
                    confidence=0.5,
                    summary=f"CUDA error {ILLEGAL_ADDRESS}{_rank_note(ngroup)} on {node}, which has hardware errors",
                    node=node,
                    job=job,
                    action="diagnose",
                    sig_text="cuda ambiguous",
                    cuda_errors=[ILLEGAL_ADDRESS],
                )
            )
            continue
        elsewhere = _repeated_elsewhere(ngroup)
        if elsewhere:
            findings.append(
                _finding(
                    ngroup,
                    key=f"cuda:illegal_address:{node}:repeated",
                    category="gpu_hardware",
                    confidence=0.65,
                    summary=f"illegal memory access{_rank_note(ngroup)} on {node}, which had the same fault alone "
                    f"under {', '.join(elsewhere)}: the machine, not the code",
                    node=node,
                    job=job,
                    blame="infrastructure",
                    action="diagnose",
                    sig_text=f"cuda {ILLEGAL_ADDRESS} repeated",
                    cuda_errors=[ILLEGAL_ADDRESS],
                    fault=ILLEGAL_ADDRESS,
                    fault_node=node,
                    repeated_elsewhere=elsewhere,
                )
            )
            continue
        findings.append(
            _finding(
                ngroup,
                key=f"cuda:illegal_address:{node}",
                category="user_code",
                confidence=0.6,
                summary=f"illegal memory access{_rank_note(ngroup)} on {node} and no hardware error there: most often "
                "a kernel of the application; restart it (the machine is suspect if it repeats this under other jobs)",
                node=None,
                subject_kind="job",
                subject=job.info.job_id,
                job=job,
                blame="user_code",
                action="restart",
                sig_text=f"cuda {ILLEGAL_ADDRESS}",
                cuda_errors=[ILLEGAL_ADDRESS],
                fault=ILLEGAL_ADDRESS,
                fault_node=node,
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
    """Data loader workers that died: out of shared memory (/dev/shm is memory, a tmpfs sized by the host or the
    container: the host's configuration, not storage), killed (host memory), or otherwise (the loader's code)."""
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
                    category="host",
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
                        category="host",
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


# What each kind of storage error says, whose it is, and how sure one is of it (job-wide, on one machine).
_STORAGE_CLAIMS: dict[str, tuple[str, str, float, float]] = {
    "io": ("filesystem I/O errors", "infrastructure", 0.7, 0.6),
    "capacity": ("filesystem full or over quota", "unknown", 0.6, 0.5),
    "shm": ("shared memory (/dev/shm) full", "unknown", 0.6, 0.5),
    "object_store": ("object store unreachable (checkpoint or data I/O)", "unknown", 0.6, 0.5),
}


def storage_kind_of(o: _Occ, text_of: Callable[[_Occ], str]) -> str | None:
    """The kind of a storage error: the parser's category for a storage_error, else the words of its text."""
    if o.kind == "storage_error":
        category = _STORAGE_CATEGORIES.get(str(o.fields.get("category")))
        if category:
            return category
        return storage_kind(str(o.fields.get("message") or o.record.line)) or "io"
    return storage_kind(text_of(o))


def _storage_finding(group: Sequence[_Occ], job: _Job, text_of: Callable[[_Occ], str]) -> list[Finding]:
    """Filesystem errors: a mount failing on one machine is that machine's; on most, the shared filesystem's. A stale
    file handle is the job's or the shared filesystem's wherever it shows (a file replaced or removed while open)."""
    findings: list[Finding] = []
    by_kind = _group(group, lambda o: storage_kind_of(o, text_of) or "io")
    stale = by_kind.pop("stale", [])
    if stale:
        findings.append(
            _finding(
                stale,
                key="storage:stale:job",
                category="storage",
                confidence=0.55,
                summary=f"stale file handle (ESTALE){_rank_note(stale)}: a shared file was replaced or removed while "
                "open (another process or node deleting it, or the file server failing over)",
                node=None,
                job=job,
                action="none",
                sig_text="storage stale",
            )
        )
    for kind, part in sorted(by_kind.items()):
        what, blame, job_confidence, node_confidence = _STORAGE_CLAIMS.get(kind, _STORAGE_CLAIMS["io"])
        if _widespread(part, job) or len(job.nodes) <= 1:
            findings.append(
                _finding(
                    part,
                    key=f"storage:{kind}:job",
                    category="storage",
                    confidence=job_confidence,
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
                    confidence=node_confidence,
                    summary=f"{what} on {node}",
                    node=node,
                    job=job,
                    blame=blame,
                    action="diagnose",
                    sig_text=f"storage {kind}",
                )
            )
    return findings
