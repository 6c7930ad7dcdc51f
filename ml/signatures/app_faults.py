"""A kernel that wrote to an unmapped address: the driver's Xid 31 (MMU fault) on a node and the illegal-address
CUDA error in a rank's traceback there. NVIDIA's catalog says RESTART_APP: most often the application's own bug
(ByteRobust too found illegal memory access to be user code twice as often as hardware). So the pair names the
application (blame user code, restart it), unless the machine repeats the fault under other jobs or other code
(the service marks such Xid lines `repeated_elsewhere`): then the machine is the suspect, to diagnose.

Runs after the other rules, on their findings: the Xid's and the CUDA error's node findings (each alone "diagnose,
blame unknown") become one claim. An illegal memory access with no hardware signal on its machine is the
application's already (runtime.py). The other faults of the application that need the other rules' findings (the
collectives the ranks disagreed on, NCCL's invalid usage) are in collectives.py, run from here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ml.findings import Finding
from ml.signatures.collectives import collective_findings
from ml.signatures.common import _finding, _Job, _Occ, _rank_note

MMU_FAULT_XID = 31
# How the illegal-address error reads: the runtime's name, the driver API's, and the parser's short name.
_ILLEGAL_ADDRESS = frozenset({"illegal_memory_access", "cudaerrorillegaladdress", "cuda_error_illegal_address"})


def _illegal_address(o: _Occ) -> bool:
    if o.kind != "cuda_error":
        return False
    names = (o.fields.get("error"), o.fields.get("code"), o.fields.get("message"))
    return any(isinstance(n, str) and any(word in n.lower() for word in _ILLEGAL_ADDRESS) for n in names)


def _mmu_fault(o: _Occ) -> bool:
    return o.kind == "xid" and o.fields.get("xid") == MMU_FAULT_XID


def application_faults(findings: list[Finding], occs: Sequence[_Occ], job: _Job) -> list[Finding]:
    """`findings` with each node's Xid 31 + illegal-address pair replaced by one claim about its cause, and the
    collective mismatches and NCCL misuse added."""
    out = _mmu_faults(findings, occs, job)
    return out + collective_findings(out, occs, job)


def _mmu_faults(findings: list[Finding], occs: Sequence[_Occ], job: _Job) -> list[Finding]:
    """`findings` with each node's Xid 31 + illegal-address pair replaced by one claim about its cause."""
    faults: dict[str, list[_Occ]] = defaultdict(list)
    errors: dict[str, list[_Occ]] = defaultdict(list)
    for o in occs:
        if _mmu_fault(o):
            faults[o.node].append(o)
        elif _illegal_address(o):
            errors[o.node].append(o)
    paired = sorted(n for n in faults if errors.get(n))
    if not paired:
        return findings
    replaced = {key for n in paired for key in (f"xid:{n}:{MMU_FAULT_XID}", f"cuda:ambiguous:{n}")}
    out = [f for f in findings if f.key not in replaced]
    for node in paired:
        out.append(_claim(node, faults[node], errors[node], job))
    return out


def _claim(node: str, faults: list[_Occ], errors: list[_Occ], job: _Job) -> Finding:
    group = [*faults, *errors]
    elsewhere = sorted({str(e) for o in faults for e in o.fields.get("repeated_elsewhere") or ()})
    processes = sorted({str(o.fields["process"]) for o in faults if o.fields.get("process")})
    pcis = sorted({str(o.fields["pci"]) for o in faults if o.fields.get("pci")})
    where = f"{node} GPU {pcis[0]}" if len(pcis) == 1 else node
    what = f"Xid {MMU_FAULT_XID} (MMU fault) on {where} and an illegal memory access{_rank_note(errors)}"
    details = {
        "xid": MMU_FAULT_XID,
        "pci": pcis or None,
        "processes": processes or None,
        "messages": sorted({str(o.fields["message"]) for o in faults if o.fields.get("message")})[:5] or None,
        "repeated_elsewhere": elsewhere or None,
        "cuda_errors": sorted({str(o.fields.get("error") or o.fields.get("code") or "?") for o in errors}),
    }
    if elsewhere:
        return _finding(
            group,
            key=f"app_fault:{node}:repeated",
            category="gpu_hardware",
            confidence=0.7,
            summary=f"{what}; the machine had the same fault under {', '.join(elsewhere)}: the machine, not the code",
            node=node,
            job=job,
            blame="infrastructure",
            action="diagnose",
            sig_text=f"xid {MMU_FAULT_XID} repeated",
            **details,
        )
    # Job-level: a restart of the application is the answer, and no machine is accused.
    return _finding(
        group,
        key=f"app_fault:{node}",
        category="user_code",
        confidence=0.75,
        summary=f"{what}: a kernel of the application wrote to an unmapped address; restart the application",
        node=None,
        subject_kind="job",
        subject=job.info.job_id,
        job=job,
        blame="user_code",
        action="restart",
        sig_text=f"xid {MMU_FAULT_XID} illegal address",
        **details,
    )
