"""RDMA verbs failures: a verbs call that failed (memory registration, queue creation) and IB async events.

NCCL's `NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory`, its NET/OFI plugin's
`Unable to register memory ... RC: 12, Error: ...`, UCX's `ibv_create_cq(cqe=4096) failed: ...` and
`NET/IB : [mlx5_0:1 ]Got async event : port error` all come down to one of two things on this node:
a verbs call the HCA or the kernel refused (its errno says why: ENOMEM on a memory registration is the
locked-memory limit or pinned memory running out), or an asynchronous event the HCA raised (a port going
down, the adapter failing). The errno is read from the error text with the C library's own strings.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit
from agents.parsers.training.nccl import NCCL_LINE, nccl_prefix

# "Call to ibv_reg_mr failed with error Cannot allocate memory", "ibv_create_cq(cqe=4096) failed: ...",
# "ibv_modify_qp failed with 110 Connection timed out", "Call to ibv_create_qp failed"
_VERBS_CALL = re.compile(
    r"\b(?:Call to )?(?P<call>ibv_\w+|mlx5dv_\w+|fi_\w+)(?:\([^()]{0,200}\))? (?:failed|returned)"
    r"(?:(?: with error|:| with)\s*(?P<error>.*?))?\s*$"
)
# aws-ofi-nccl: "NET/OFI Unable to register memory (type = 1) for device 0. RC: 12, Error: Cannot allocate memory"
# (and other plugins' "Failed to register memory ...: Cannot allocate memory")
_OFI_REGISTER = re.compile(
    r"(?:Unable|Failed|Could not) (?:to )?register memory"
    r"(?:.*?RC: ?(?P<rc>-?\d+)(?:, Error: (?P<error>.*?))?|.*?(?:[:,] |error )(?P<text>[A-Z][a-z][^:,]{3,60}))?\s*$"
)
# "NET/IB : Got async event : port error", "NET/IB : mlx5_0:1 Got async event : local access violation ...", and
# NCCL 2.19 on: "NET/IB : mlx5_32:1 Got async error event: port error", "NET/IB : mlx5_0:1 async fatal event on QP
# (0x5581...): local work queue catastrophic error", "... async fatal event: local catastrophic error"
_ASYNC = re.compile(
    r"(?:(?P<dev>[\w-]+):(?P<port>\d+) )?(?:Got async (?:error )?event|async fatal event(?: on \w+[^:]*)?)\s*:\s*"
    r"(?P<event>[^:]+?)\s*(?:$|event type)"
)
_ERRNO_NUM = re.compile(r"^-?(\d{1,3})\b")

# strerror text -> errno name, from the C library this runs on: "Cannot allocate memory" -> "ENOMEM".
_STRERROR: dict[str, str] = {os.strerror(n).lower(): name for n, name in errno.errorcode.items()}

# ibv_event_type_str() (libibverbs): the words NCCL prints, and the enum each stands for.
IBV_EVENTS: dict[str, str] = {
    "cq error": "IBV_EVENT_CQ_ERR",
    "local work queue catastrophic error": "IBV_EVENT_QP_FATAL",
    "invalid request local work queue error": "IBV_EVENT_QP_REQ_ERR",
    "local access violation work queue error": "IBV_EVENT_QP_ACCESS_ERR",
    "communication established": "IBV_EVENT_COMM_EST",
    "send queue drained": "IBV_EVENT_SQ_DRAINED",
    "path migrated": "IBV_EVENT_PATH_MIG",
    "path migration request error": "IBV_EVENT_PATH_MIG_ERR",
    "local catastrophic error": "IBV_EVENT_DEVICE_FATAL",
    "port active": "IBV_EVENT_PORT_ACTIVE",
    "port error": "IBV_EVENT_PORT_ERR",
    "lid change": "IBV_EVENT_LID_CHANGE",
    "p_key change": "IBV_EVENT_PKEY_CHANGE",
    "sm change": "IBV_EVENT_SM_CHANGE",
    "srq catastrophic error": "IBV_EVENT_SRQ_ERR",
    "srq limit reached": "IBV_EVENT_SRQ_LIMIT_REACHED",
    "last wqe reached": "IBV_EVENT_QP_LAST_WQE_REACHED",
    "client reregistration": "IBV_EVENT_CLIENT_REREGISTER",
    "gid table change": "IBV_EVENT_GID_CHANGE",
    "wq fatal": "IBV_EVENT_WQ_FATAL",
}
# Events that say something broke (the others are state changes a healthy fabric also sees).
FATAL_EVENTS = frozenset(
    {
        "IBV_EVENT_CQ_ERR",
        "IBV_EVENT_QP_FATAL",
        "IBV_EVENT_QP_REQ_ERR",
        "IBV_EVENT_QP_ACCESS_ERR",
        "IBV_EVENT_PATH_MIG_ERR",
        "IBV_EVENT_DEVICE_FATAL",
        "IBV_EVENT_PORT_ERR",
        "IBV_EVENT_SRQ_ERR",
        "IBV_EVENT_WQ_FATAL",
    }
)

_HINTS = ("ibv_", "Got async", "async fatal event", "register memory", "mlx5dv_", "fi_mr", "fi_reg")


def call_category(call: str) -> str:
    """What a failed verbs call was doing: registering memory, creating a resource, connecting, or else."""
    low = call.lower()
    if "reg_mr" in low or "mr_reg" in low or "register" in low:
        return "memory_registration"
    if any(w in low for w in ("create", "alloc", "open_device")):
        return "resource"
    if "modify_qp" in low or "connect" in low:
        return "connection"
    return "call"


def errno_name(error: str | None) -> str | None:
    """The errno name of an error text: "Cannot allocate memory" or "12" -> "ENOMEM"; None when unknown."""
    if not error:
        return None
    text = error.strip().rstrip(".").strip()
    m = _ERRNO_NUM.match(text)
    if m:
        return errno.errorcode.get(int(m.group(1)))
    low = text.lower()
    for message, name in _STRERROR.items():
        if message and message in low:
            return name
    named = re.search(r"\b(E[A-Z]{2,15})\b", text)
    return named.group(1) if named and named.group(1) in errno.__dict__ else None


def rule_ib_verbs(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if not any(h in body for h in _HINTS):
        return False
    fields: dict[str, Any] = {}
    nccl = NCCL_LINE.search(body)
    if nccl:
        fields.update(nccl_prefix(nccl))
    m = _ASYNC.search(body)
    if m:
        event = m.group("event").strip()
        name = IBV_EVENTS.get(event.lower())
        fatal = name in FATAL_EVENTS or (name is None and ("error" in event.lower() or "fatal" in event.lower()))
        fields.update({"event": event, "event_name": name, "ib_device": m.group("dev"), "port": _int(m.group("port"))})
        fields["fatal"] = fatal
        emit("ib_async_event", "error" if fatal else "warning", fields, critical=fatal)
        return True
    m = _OFI_REGISTER.search(body)
    if m:
        call, error = (
            "fi_mr_reg" if "OFI" in body else "register_memory",
            m.group("error") or m.group("text") or m.group("rc"),
        )
        name = errno_name(m.group("rc")) or errno_name(error)
    else:
        m = _VERBS_CALL.search(body)
        if not m:
            return False
        call, error = m.group("call"), (m.group("error") or "").strip() or None
        name = errno_name(error)
    category = call_category(call)
    fields.update({"call": call, "errno": name, "error": (error or None) and error[:MAX_MESSAGE], "category": category})
    if category == "memory_registration" and name in ("ENOMEM", "EPERM", "EAGAIN"):
        # Registering memory pins it: ENOMEM is RLIMIT_MEMLOCK (ulimit -l) or the node's pinnable memory.
        fields["hint"] = "memlock"
    emit("ib_verbs_error", "error", fields, critical=True)
    return True


def _int(text: str | None) -> int | None:
    return int(text) if text else None
