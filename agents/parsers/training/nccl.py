"""NCCL: `NCCL WARN` lines, InfiniBand completion errors, and NCCL errors raised to Python."""

from __future__ import annotations

import re
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit, int_or_none, search_int
from agents.parsers.training.cuda import CUDA_FAILURE, cuda_name

# "host:pid:tid [dev] src.cc:123 NCCL WARN message"
NCCL_LINE = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>[\w./-]+:\d+) )?NCCL WARN (?P<msg>.*)"
)
_IB = re.compile(
    r"Got completion (?:from peer (?:(?P<peer>[^\s<]+)(?:<(?P<port>\d+)>)? )?)?with "
    r"(?:error (?P<err>\d+)|status=(?P<status>\d+))"
)
_IB_INTS = (
    ("opcode", re.compile(r"opcode[= ](\d+)")),
    ("len", re.compile(r"\blen[= ](\d+)")),
    ("vendor_err", re.compile(r"vendor err (\d+)")),
)
_IB_WORDS = (
    ("direction", re.compile(r"\((Send|Recv)\)")),
    ("local_gid", re.compile(r"localGid\s*(\S+)")),
    ("remote_gid", re.compile(r"remoteGids?\s*(\S+)")),
)
_IB_CUT_MAX = 300  # a longer line is not the rest of a wrapped IB error line
# ibv_wc_status (libibverbs verbs.h); 12 (retry exceeded) is the classic "link or peer gone".
IBV_WC_STATUS: dict[int, str] = {
    0: "IBV_WC_SUCCESS",
    1: "IBV_WC_LOC_LEN_ERR",
    2: "IBV_WC_LOC_QP_OP_ERR",
    3: "IBV_WC_LOC_EEC_OP_ERR",
    4: "IBV_WC_LOC_PROT_ERR",
    5: "IBV_WC_WR_FLUSH_ERR",
    6: "IBV_WC_MW_BIND_ERR",
    7: "IBV_WC_BAD_RESP_ERR",
    8: "IBV_WC_LOC_ACCESS_ERR",
    9: "IBV_WC_REM_INV_REQ_ERR",
    10: "IBV_WC_REM_ACCESS_ERR",
    11: "IBV_WC_REM_OP_ERR",
    12: "IBV_WC_RETRY_EXC_ERR",
    13: "IBV_WC_RNR_RETRY_EXC_ERR",
    14: "IBV_WC_LOC_RDD_VIOL_ERR",
    15: "IBV_WC_REM_INV_RD_REQ_ERR",
    16: "IBV_WC_REM_ABORT_ERR",
    17: "IBV_WC_INV_EECN_ERR",
    18: "IBV_WC_INV_EEC_STATE_ERR",
    19: "IBV_WC_FATAL_ERR",
    20: "IBV_WC_RESP_TIMEOUT_ERR",
    21: "IBV_WC_GENERAL_ERR",
}

# ncclResult_t (nccl.h)
NCCL_CODES: dict[int, str] = {
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
_NCCL_ERRORS = "RemoteError|SystemError|InternalError|InvalidArgument|InvalidUsage|UnhandledCudaError"
_NCCL_CODE = re.compile(rf"\bnccl({_NCCL_ERRORS})\b")
# The words of each code in PyTorch's messages ("NCCL error in: ..., unhandled system error ...").
_NCCL_PHRASES: tuple[tuple[str, str], ...] = (
    ("unhandled system error", "ncclSystemError"),
    ("unhandled cuda error", "ncclUnhandledCudaError"),
    ("remote process exited or there was a network error", "ncclRemoteError"),
    ("internal check failed", "ncclInternalError"),
    ("invalid usage", "ncclInvalidUsage"),
    ("invalid argument", "ncclInvalidArgument"),
)
_NCCL_ERR_IN = re.compile(r"NCCL error in: (\S+?),? ")
_NCCL_ERROR_N = re.compile(r"NCCL Error (\d):")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_NCCL_LAST = re.compile(r"Last error:\s*(.{1,500}?)(?:\s{2,}|$)")
_NCCL_RETCODE = re.compile(r"retcode (\d)")
# "[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0',
# but store->get('0') got error: Socket Timeout" (PyTorch spelled it "retreiving" until 2.1)
_UNIQUE_ID = re.compile(r"\[(\d+)\] is setting up NCCL communicator and \w+ ncclUniqueId from \[(\d+)\]")
_STORE_ERROR = re.compile(r"got (?:error|exception): (.+?)(?:\s+Exception raised from|$)")
_NCCL_ERROR_HINT = re.compile(
    r"NCCL error|NCCL communicator was aborted|DistBackendError|ncclCommAbort|NCCL Error \d|"
    r"setting up NCCL communicator|"
    rf"\bnccl(?:{_NCCL_ERRORS})\b"
)
_SOCKET = re.compile(
    r"(?i)socket\w*:|connect to \S+ failed|connection closed by remote peer|socket recv failed|"
    r"connection refused|connection reset|connection abort|failed to execute operation connect"
)
_PEER = re.compile(r"(?:to|peer) ([\w.:%-]+?)<(\d+)>")
# Two ranks on one GPU (ncclInvalidUsage): "Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 1000"
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device (\w+)")
# PyTorch 2.x: "Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, ...) raised the following async exception: ..."
_ASYNC_WORK = re.compile(r"WorkNCCL\((?:[^()]*?SeqNum=(?P<seq>\d+))?(?:[^()]*?OpType=(?P<op>\w+))?")


def rule_ib(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "Got completion" not in body:
        return False
    m = _IB.search(body)
    if not m:
        return False
    status = int(m.group("err") or m.group("status"))
    fields: dict[str, Any] = {"status": status, "status_name": IBV_WC_STATUS.get(status)}
    for name, regex in _IB_INTS:
        fields[name] = search_int(regex, body, m.end())
    fields["peer"] = m.group("peer")
    fields["peer_port"] = int_or_none(m.group("port"))
    for name, regex in _IB_WORDS:
        found = regex.search(body, m.end())
        if found:
            fields[name] = found.group(1)
    nccl = NCCL_LINE.search(body)
    if nccl:
        fields.update(nccl_prefix(nccl))
    emit("ib_error", "error", fields, critical=True)
    # A NCCL error whose "Last error:" is the IB completion: report both.
    return not _NCCL_ERROR_HINT.search(body)


def ib_line_may_go_on(body: str) -> bool:
    """An IB completion error without its "vendor err": NCCL wraps long lines, the rest may follow."""
    return "Got completion" in body and "vendor err" not in body and _IB.search(body) is not None


def continues_ib_line(body: str) -> bool:
    """Whether `body` is the rest of a wrapped IB error line rather than a message of its own."""
    return not (len(body) > _IB_CUT_MAX or NCCL_LINE.search(body) or "NCCL" in body or not body.strip())


def rule_nccl_warn(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "NCCL WARN" not in body:
        return False
    m = NCCL_LINE.search(body)
    if not m:
        return False
    fields = nccl_prefix(m)
    message = m.group("msg").strip()
    fields["message"] = message
    if "Cuda failure" in message or "CUDA failure" in message:
        failure = CUDA_FAILURE.search(message)
        text = failure.group(1) if failure else message
        if "out of memory" in text:
            emit("oom", "error", {**fields, "tried_bytes": None, "gpu": None}, critical=True)
        else:
            emit("cuda_error", "error", {**fields, "error": cuda_name(text)}, critical=True)
        return True
    duplicate = duplicate_gpu(message)
    if duplicate:
        emit("nccl_warn", "error", {**fields, **duplicate}, critical=True)
        return True
    retcode = _NCCL_RETCODE.search(message)
    if _SOCKET.search(message) or retcode:
        fields["nccl_code"] = NCCL_CODES.get(int(retcode.group(1))) if retcode else None
        fields["category"] = "socket" if _SOCKET.search(message) else "proxy"
        peer = _PEER.search(message)
        if peer:
            fields["peer"], fields["peer_port"] = peer.group(1), int(peer.group(2))
        emit("nccl_error", "error", fields, critical=True)
        return True
    emit("nccl_warn", "warning", fields)
    return True


def rule_nccl_error(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "nccl" not in low or not _NCCL_ERROR_HINT.search(body):
        return False
    fields: dict[str, Any] = {"nccl_code": _nccl_code(body, low)}
    if "communicator was aborted" in low:
        fields["category"] = "comm_aborted"
    unique_id = _UNIQUE_ID.search(body) if "ncclUniqueId" in body else None
    if unique_id:  # NCCL init: this rank waited in the store for the id the root rank publishes
        fields["category"] = "init_store"
        fields["rank"], fields["root_rank"] = int(unique_id.group(1)), int(unique_id.group(2))
        error = _STORE_ERROR.search(body)
        if error:
            fields["store_error"] = error.group(1).strip()[:MAX_MESSAGE]
    for name, regex in (("src", _NCCL_ERR_IN), ("nccl_version", _NCCL_VERSION)):
        found = regex.search(body)
        if found:
            fields[name] = found.group(1)
    work = _ASYNC_WORK.search(body) if "WorkNCCL(" in body else None
    if work:  # the collective that raised it
        fields["seq"], fields["op"] = int_or_none(work.group("seq")), work.group("op")
    last = _NCCL_LAST.search(body)
    if last:
        fields["last_error"] = last.group(1).strip()
    fields.update(duplicate_gpu(body) or {})
    start = body.find("NCCL error")
    fields["message"] = body[start if start >= 0 else 0 :].strip()[:MAX_MESSAGE]
    emit("nccl_error", "error", fields, rank if rank is not None or not unique_id else fields["rank"], critical=True)
    return True


def rule_duplicate_gpu(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    """The line after a NCCL error's "Last error:", on its own: two ranks were given the same GPU."""
    if "Duplicate GPU" not in body:
        return False
    duplicate = duplicate_gpu(body)
    if duplicate is None:
        return False
    emit("nccl_error", "error", {**duplicate, "message": body.strip()[:MAX_MESSAGE]}, critical=True)
    return True


def duplicate_gpu(text: str) -> dict[str, Any] | None:
    """The fields of NCCL's "Duplicate GPU detected" check: the launch gave two ranks one CUDA device (their
    local rank does not pick the device), which NCCL refuses as invalid usage."""
    m = _DUPLICATE_GPU.search(text) if "Duplicate GPU" in text else None
    if m is None:
        return None
    return {
        "category": "duplicate_gpu",
        "nccl_code": "ncclInvalidUsage",
        "ranks": [int(m.group(1)), int(m.group(2))],
        "cuda_device": m.group(3),
    }


def _nccl_code(body: str, low: str) -> str | None:
    """The ncclResult_t name: spelled out, as "NCCL Error N:", or in PyTorch's words for it."""
    m = _NCCL_CODE.search(body)
    if m:
        return "nccl" + m.group(1)
    n = _NCCL_ERROR_N.search(body)
    if n:
        return NCCL_CODES.get(int(n.group(1)))
    for phrase, code in _NCCL_PHRASES:
        if phrase in low:
            return code
    return None


def nccl_prefix(m: re.Match[str]) -> dict[str, Any]:
    """host, pid, tid, device and source location of a `NCCL_LINE` match."""
    return {
        "host": m.group("host"),
        "pid": int(m.group("pid")),
        "tid": int(m.group("tid")),
        "device": int(m.group("dev")),
        "src": m.group("src"),
    }
