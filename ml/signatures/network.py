"""Network rules: InfiniBand completion errors, ports gone down, an adapter's own fatal error, RDMA verbs failures and
async events on a node, and NCCL errors (a remote peer they name is a pointer; a failure of the NVLS transport is the
node's NVLink fabric)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping

from ml.findings import Finding
from ml.signatures.common import MAX_LIST, _finding, _group, _Job, _Occ, _rank_note, _times, _ts

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
                # The link stopped answering: NCCL cannot carry on over such a queue pair, so its communicator (the
                # job's collectives) is lost. The policy decides a lone flap that did this at once.
                connections_lost=True if link else None,
            )
        )
    return findings


def _port_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """RDMA ports the node's agent saw go down between its reads (agents/port_watch.py, `port_down`): the node's own
    link, each a flap, stamped with the latest so that each stores its own finding and the policy's flap tolerance
    counts them. `port_flaps` names each flap by its port's link_downed count, which the window rule
    (ml/node_signals.py) reports for the same flap later: counted once (service/decisions/service.py)."""
    findings = []
    for node, group in sorted(_group((o for o in occs if o.kind == "port_down"), lambda o: o.node).items()):
        ports = sorted({str(o.fields["port"]) for o in group if o.fields.get("port")})
        flaps = [
            {
                "port": str(o.fields.get("port") or ""),
                "link_downed": downed if isinstance(downed := o.fields.get("link_downed"), int) else None,
                "at": _ts(o.record).isoformat(),
            }
            for o in group
        ]
        times = _times(group)
        findings.append(
            _finding(
                group,
                key=f"ib:{node}:port",
                category="network",
                confidence=0.85,
                summary=f"{', '.join(ports) or 'an RDMA port'} on {node} went down "
                f"({len(flaps)} time{'s' * (len(flaps) > 1)})",
                node=node,
                job=job,
                blame="infrastructure",
                action="evict",
                sig_text=f"port down {ports}",
                times=times,
                ports=ports,
                port_flaps=flaps[-MAX_LIST:],
            )
        )
    return findings


def _adapter_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """A network adapter whose driver reported a failure of its own: a fatal error (the kernel's `nic_fatal`: mlx5's
    health poller) or a port module at fault (`nic_module_error`: the cable or transceiver, its port disabled). The
    node's hardware, marked `adapter_failed` so that the policy's flap tolerance does not wait for a second fault.
    The port watch's `port_down` and NCCL's errors of the same moment are its consequences."""
    findings = []
    mine = (o for o in occs if o.kind in ("nic_fatal", "nic_module_error"))
    for node, group in sorted(_group(mine, lambda o: o.node).items()):
        devices = sorted({str(o.fields["device"]) for o in group if o.fields.get("device")})
        errors = sorted({e for o in group if isinstance(e := o.fields.get("error"), int)})
        problems = sorted(
            {f"module {o.fields.get('module', '?')}: {p}" for o in group if (p := o.fields.get("problem"))}
        )
        fatal = any(o.kind == "nic_fatal" for o in group)
        what = f"network adapter {', '.join(devices) or '?'} on {node}"
        if fatal:
            detail = f" (firmware fatal error {', '.join(map(str, errors))})" if errors else ""
            summary = f"{what} failed{detail}"
        else:
            summary = f"{what}: a port's cable or transceiver at fault ({'; '.join(problems)})"
        findings.append(
            _finding(
                group,
                key=f"ib_adapter:{node}",
                category="network",
                confidence=0.9 if fatal else 0.85,
                summary=summary,
                node=node,
                job=job,
                blame="infrastructure",
                action="evict",
                sig_text=f"nic {'fatal' if fatal else 'module'} {devices}",
                times=_times(group),
                device=", ".join(devices) or None,
                reason="adapter_fatal" if fatal else "module_error",
                adapter_failed=True,
                **({"module_problems": problems} if problems else {}),
            )
        )
    return findings


# IB async events that mean the link or the adapter itself failed on this node.
_IB_LINK_EVENTS = frozenset({"IBV_EVENT_PORT_ERR", "IBV_EVENT_DEVICE_FATAL"})


def _ib_verbs_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """A node whose RDMA stack refused a verbs call or raised a fatal async event: that node's problem.

    ENOMEM on a memory registration or on creating a queue (or such a call failing with no errno printed) is
    almost always the node's locked-memory limit, `ulimit -l`: a configuration fault of that host (category host),
    not its network hardware nor the job's code; a port error or a catastrophic adapter error is the link or the
    HCA. A call that only reports the async thread
    stopping (ibv_get_async_event) rides along with the event that stopped it.
    """
    kinds = ("ib_verbs_error", "ib_async_event")
    groups = _group((o for o in occs if o.kind in kinds and _ib_fault(o)), lambda o: o.node)
    findings = []
    for node, group in sorted(groups.items()):
        events = sorted({str(o.fields.get("event_name") or o.fields.get("event")) for o in group if o.kind == kinds[1]})
        words = sorted({str(o.fields["event"]) for o in group if o.kind == kinds[1] and o.fields.get("event")})
        verbs = [o for o in group if o.kind == kinds[0]]
        calls = sorted({str(o.fields["call"]) for o in verbs if o.fields.get("call")})
        errnos = sorted({str(o.fields["errno"]) for o in verbs if o.fields.get("errno")})
        categories = {str(o.fields.get("category")) for o in verbs}
        times = _times(group)
        category = "network"
        fatal = "IBV_EVENT_DEVICE_FATAL" in events
        if set(events) & _IB_LINK_EVENTS:
            confidence, action = (0.85 if fatal else 0.8), "evict"
            what = f"InfiniBand {', '.join(words or events)} on {node}"
            reason = "link_or_adapter"
        elif categories & {"memory_registration", "resource"}:
            confidence, action = 0.7, "diagnose"
            memlock = _memlock(verbs)
            what = f"RDMA {', '.join(calls)} failed on {node}" + (f" ({', '.join(errnos)})" if errnos else "")
            if memlock:
                # The host's configuration (limits.conf, the container runtime's memlock), not its network hardware.
                category, confidence = "host", 0.7 if errnos else 0.6
                what += ": locked-memory limit (ulimit -l) too low? host configuration"
            else:
                what += ": RDMA resources"
            reason = "memlock" if memlock else "rdma_resources"
        else:
            confidence, action = 0.5, "diagnose"
            what = f"RDMA errors on {node}: {', '.join(words or calls)}"
            reason = "rdma_error"
        findings.append(
            _finding(
                group,
                key=f"ib_verbs:{node}",
                category=category,
                confidence=confidence,
                summary=f"{what} ({len(times)} occurrence{'s' * (len(times) > 1)})",
                node=node,
                job=job,
                blame="infrastructure",
                action=action,
                sig_text=f"ib verbs {reason} {calls or events}",
                times=times,
                calls=calls or None,
                errnos=errnos or None,
                ib_events=events or None,
                reason=reason,
                # The adapter itself failed: not a link that may come back, so the policy's flap tolerance
                # does not wait for a second one.
                adapter_failed=fatal or None,
            )
        )
    return findings


# Errnos of a verbs call that pins memory (registering it, creating a queue) that come down to RLIMIT_MEMLOCK.
_MEMLOCK_ERRNOS = frozenset({"ENOMEM", "EAGAIN", "EPERM"})


def _memlock(verbs: list[_Occ]) -> bool:
    """Whether failed verbs calls read as the locked-memory limit: memory registration or queue creation failing with
    ENOMEM (EAGAIN, EPERM for a registration) or with no errno printed (NCCL before 2.12 printed none). Both pin
    memory, and a too-low `ulimit -l` (a container's default 64 KiB, limits.conf) is what almost always refuses it."""
    pinning = [o for o in verbs if o.fields.get("category") in ("memory_registration", "resource")]
    if not pinning:
        return False
    for o in pinning:
        errno = o.fields.get("errno")
        allowed = _MEMLOCK_ERRNOS if o.fields.get("category") == "memory_registration" else {"ENOMEM"}
        if errno and errno not in allowed:
            return False
    return True


def _ib_fault(o: _Occ) -> bool:
    """A fatal async event, or a verbs call other than the async thread's own read."""
    if o.kind == "ib_async_event":
        return bool(o.fields.get("fatal"))
    return o.fields.get("call") != "ibv_get_async_event"


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


def _nvls(o: _Occ) -> bool:
    """A NCCL failure in its NVLS transport (NVLink SHARP: multicast memory on the NVSwitches), as a NCCL error or
    the CUDA error it warns of ("transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'")."""
    if o.kind not in ("nccl_error", "cuda_error"):
        return False
    return "transport/nvls" in str(o.fields.get("src") or "") or "transport/nvls" in o.record.line


def _nvls_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    """NVLS setup failing on a node is the NVLink fabric's, not the job's code: the fabric manager restarted
    without the GPUs being reset (NVIDIA/nccl#1488), or the fabric is not ready. To diagnose on that node."""
    findings = []
    for node, group in sorted(_group((o for o in occs if _nvls(o)), lambda o: o.node).items()):
        findings.append(
            _finding(
                group,
                key=f"nccl_nvls:{node}",
                category="nvlink",
                confidence=0.6,
                summary=f"NCCL's NVLS transport (NVLink multicast) fails{_rank_note(group)} on {node}",
                node=node,
                job=job,
                blame="infrastructure",
                action="diagnose",
                sig_text="nccl nvls failure",
                times=_times(group),
            )
        )
    return findings


def _nccl_findings(occs: list[_Occ], job: _Job) -> list[Finding]:
    nvls = _nvls_findings(occs, job)
    errors = [o for o in occs if o.kind == "nccl_error"]
    if not errors:
        return nvls
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
    findings: list[Finding] = nvls
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
