"""Network rules: InfiniBand completion errors and NCCL errors (a remote peer they name is a pointer)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping

from ml.findings import Finding
from ml.signatures.common import MAX_LIST, _finding, _group, _Job, _Occ, _rank_note, _times

# IB completion statuses that say the link or the peer stopped answering (ibv_wc_status).
_IB_LINK_STATUSES = frozenset({12, 13, 20})  # RETRY_EXC, RNR_RETRY_EXC, RESP_TIMEOUT
_IB_FLUSH = 5  # WR_FLUSH_ERR: the queue pair already failed; a consequence of another error
_HOST_IN_TEXT = re.compile(r"\(host ([\w.-]+)\)|(?:peer|to|from) ([\w.:%-]+?)<\d+>|remote peer ([\w.-]+)")


def _ib_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    groups = _group((o for o in occs if o.kind == "ib_error"), lambda o: o.node)
    findings = []
    for node, group in sorted(groups.items()):
        statuses = sorted({s for o in group if isinstance(s := o.fields.get("status"), int)})
        names = sorted({str(o.fields["status_name"]) for o in group if o.fields.get("status_name")})
        link = [s for s in statuses if s in _IB_LINK_STATUSES]
        if link:
            confidence, action, blame = 0.85, "evict", "infrastructure"
        elif statuses and set(statuses) <= {_IB_FLUSH}:
            confidence, action, blame = 0.45, "diagnose", "unknown"  # flushed after an earlier failure
        else:
            confidence, action, blame = 0.5, "diagnose", "unknown"  # protection/access errors: often software
        peers = sorted({str(o.fields["peer"]) for o in group if o.fields.get("peer")})
        peer_nodes = sorted({p for peer in peers if (p := job.resolve(peer)) and p != node})
        times = _times(group)
        label = ", ".join(f"status {s}" for s in statuses) or "error"
        findings.append(
            _finding(
                group,
                key=f"ib:{node}",
                category="network",
                confidence=confidence,
                summary=f"InfiniBand completion {label} on {node} ({len(times)} occurrence{'s' * (len(times) > 1)})",
                node=node,
                job=job,
                blame=blame,
                action=action,
                sig_text=f"ib {link or statuses}",
                times=times,
                statuses=statuses,
                status_names=names or None,
                peers=peers[:MAX_LIST] or None,
                peer_nodes=peer_nodes or None,
                vendor_errors=sorted({v for o in group if isinstance(v := o.fields.get("vendor_err"), int)}) or None,
            )
        )
    return findings


def _peer_named(o: _Occ) -> str | None:
    """The peer host or address a NCCL error names: its field, or "(host X)", "peer X<port>" in its text."""
    peer = o.fields.get("peer")
    if isinstance(peer, str) and peer:
        return peer
    text = " ".join(str(o.fields.get(k) or "") for k in ("message", "last_error"))
    m = _HOST_IN_TEXT.search(text)
    if m:
        return next(g for g in m.groups() if g)
    return None


def _carries_ib(o: _Occ) -> bool:
    """A NCCL error whose last error is this machine's own IB completion error: the IB rule covers it."""
    related = o.fields.get("related")
    if isinstance(related, list) and any(isinstance(e, Mapping) and e.get("kind") == "ib_error" for e in related):
        return True
    return "Got completion" in str(o.fields.get("last_error") or "")


def _is_remote(o: _Occ) -> bool:
    text = " ".join(str(o.fields.get(k) or "") for k in ("message", "last_error")).lower()
    return (
        o.fields.get("nccl_code") == "ncclRemoteError"
        or "remote" in text
        or "closed by" in text
        or "connect to" in text
        or o.fields.get("category") == "socket"
    )


def _nccl_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    errors = [o for o in occs if o.kind == "nccl_error"]
    if not errors:
        return []
    pointers: dict[str, list[_Occ]] = defaultdict(list)
    peers_unresolved: set[str] = set()
    for o in errors:
        peer = _peer_named(o)
        if not peer or not _is_remote(o) or _carries_ib(o):
            continue
        peer_node = job.resolve(peer)
        if peer_node and peer_node != o.node:
            pointers[peer_node].append(o)
        elif not peer_node:
            peers_unresolved.add(peer)
    findings: list[Finding] = []
    for peer_node, group in sorted(pointers.items()):
        reporters = {o.node for o in group}
        # Several machines naming the same peer say more than one; still only a pointer, never an eviction.
        confidence = min(0.65, 0.35 + 0.1 * (len(reporters) - 1))
        findings.append(
            _finding(
                group,
                key=f"nccl_peer:{peer_node}",
                category="job_failure",
                confidence=confidence,
                summary=f"NCCL errors on {len(reporters)} node{'s' * (len(reporters) > 1)} name peer {peer_node}",
                node=peer_node,
                job=job,
                role="symptom",
                action="diagnose",
                sig_text=f"nccl peer {peer_node}",
                reporters=sorted(reporters),
            )
        )
    codes = sorted({str(o.fields["nccl_code"]) for o in errors if o.fields.get("nccl_code")})
    findings.append(
        _finding(
            errors,
            key="nccl_error",
            category="job_failure",
            confidence=0.3,
            summary=f"NCCL errors{_rank_note(errors)} ({', '.join(codes) or 'no code'})",
            node=None,
            job=job,
            role="symptom",
            sig_text="nccl error " + " ".join(codes),
            nccl_codes=codes or None,
            peers=sorted(peers_unresolved)[:MAX_LIST] or None,
        )
    )
    return findings
