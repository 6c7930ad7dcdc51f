"""Training log parser: NCCL, watchdog timeouts, CUDA errors, tracebacks, torchrun failures, progress.

Lines may carry launcher prefixes (torchrun `[rank3]:` / `[default3]:`, srun `3: `, timestamps,
glog/c10 `[E321 02:07:08.408 file.cc:607]`); they are stripped, and the rank and time taken from them.
Multi-line blocks (Python tracebacks, torchrun's ChildFailedError table, `terminate called ...` with
its `what():`, C++ frame dumps, the NCCL desync report) are collected per prefix, so interleaved ranks
do not mix, and each becomes one event. A line may yield more than one event (a progress bar with an
error glued to its end; a NCCL remote error that carries an IB completion error).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.events import Event
from agents.parsers import MAX_EVENT_LINE, as_utc, clip, infer_year, match_window

log = logging.getLogger(__name__)

SOURCE = "training"

# Each pattern needs a named group `step`; optional groups: loss, grad_norm, elapsed_ms, lr, total.
# A pattern whose `step` group did not take part in the match (the Trainer's log dict has no step)
# gets the last step seen. Lookaheads of the form (?=(?:.*?X(?P<g>...))?) pick up fields in any order.
DEFAULT_STEP_PATTERNS: tuple[str, ...] = (
    # Megatron-LM / Megatron-DeepSpeed:
    # " iteration      100/  500000 | consumed samples: ... | elapsed time per iteration (ms): 1234.5 |
    #   learning rate: 3.0E-04 | ... | lm loss: 2.345E+00 | loss scale: 1.0 | grad norm: 1.23 | ..."
    r"iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|"
    r"(?=(?:.*?elapsed time per iteration \(ms\):\s*(?P<elapsed_ms>[^\s|]+))?)"
    r"(?=(?:.*?learning rate:\s*(?P<lr>[^\s|]+))?)"
    r"(?=(?:.*?\|\s*(?:lm )?loss:\s*(?P<loss>[^\s|]+))?)"
    r"(?=(?:.*?grad norm:\s*(?P<grad_norm>[^\s|]+))?)",
    # Hugging Face Trainer: {'loss': 2.345, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}
    r"\{'loss': (?P<loss>[^,}]+)"
    r"(?=(?:.*?'grad_norm': (?P<grad_norm>[^,}]+))?)"
    r"(?=(?:.*?'learning_rate': (?P<lr>[^,}]+))?)"
    r"(?=(?:.*?'step': (?P<step>\d+))?)",
    # tqdm training bars (Trainer, Lightning "Epoch 0: ..."), not dataset/eval bars:
    # "  5%|▌         | 50/1000 [00:10<03:10,  5.00it/s, loss=2.6]"
    r"^(?:\s*|Epoch \d+:\s*|(?:Training|Train|Steps?|Iteration)s?:?\s*)"
    r"\d{1,3}%\|[^|]{0,200}\|\s*(?P<step>\d+)/(?P<total>\d+)\b"
    r"(?=(?:[^\]]*?\bloss=(?P<loss>[^\s,\]]+))?)",
    # generic: "step=100 loss=2.3 grad_norm=1.1", "step 100 | loss 2.3", "Step 100/1000, loss: 2.3"
    r"(?i)\bstep[\s=:]+(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?"
    r"(?=(?:.*?\bloss[\s=:]+(?P<loss>[-+\w.]+))?)"
    r"(?=(?:.*?\bgrad[_ ]norm[\s=:]+(?P<grad_norm>[-+\w.]+))?)"
    r"(?=(?:.*?\b(?:lr|learning[_ ]rate)[\s=:]+(?P<lr>[-+\w.]+))?)",
)

_WINDOW = 20  # recent values the spike check compares with
_MIN_HISTORY = 5  # values needed before judging a spike
_MAX_BLOCK_LINES = 2000
_MAX_FRAMES = 50
_STALE_LINES = 200  # a block that saw no line of its own for this many lines is finished
_STALE_SECONDS = 10.0  # ... or for this long (the agent flushes only when the whole file goes idle)

# -- prefixes --------------------------------------------------------------------------------------

_P_ISO = re.compile(
    r" {0,4}\[?(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?\s?(Z|[+-]\d\d:?\d\d)?\]? ?"
)
_P_LEVEL = re.compile(r"\[(INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\] (?=\d{4}-)")
_P_PID = re.compile(r"\[\d{1,10}\] (?=\[(?:rank|default)\d)")
_P_TORCHRUN = re.compile(r"\[(rank|default|[A-Za-z_]{1,32}?)(\d{1,6})\]: ?")
_P_SRUN = re.compile(r" {0,5}(\d{1,6}): ")
# glog: "E0213 12:07:20.086000 870572 torch/.../api.py:869] "; c10: "[E321 02:07:08.408271257 file.cc:607] "
_P_GLOG = re.compile(r"\[?([IWEF])(\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})(?: +\d+)? [^\s\]]{1,200}:\d+\] ?")
_P_C10 = re.compile(r"\[([IWEF]) [^\s\]]{1,200}:\d+\] ?")  # older c10: "[E ProcessGroupNCCL.cpp:821] "

# -- single-line rules -----------------------------------------------------------------------------

_WATCHDOG = re.compile(
    r"(?:\[(?P<tag>[^\[\]]{0,120}?Rank \d+)\]\s*)?Watchdog caught collective operation timeout: "
    r"WorkNCCL\((?P<args>[^()]{0,600}(?:\([^()]{0,20}\)[^()]{0,600})*)\)?(?: ran for (?P<elapsed>\d+) milliseconds)?"
)
_WD_EXC = re.compile(
    r"(?:\[(?P<tag>[^\[\]]{0,120}?Rank \d+)\]\s*)?(?:Exception \(either an error or timeout\) detected by watchdog "
    r"at work|(?P<timeout>Timeout) at NCCL work): (?P<seq>\d+)(?:, last enqueued NCCL work: (?P<enq>-?\d+))?"
    r"(?:, last completed NCCL work: (?P<done>-?\d+))?"
)
_TAG_RANK = re.compile(r"Rank (\d+)")
_TAG_PG = re.compile(r"PG (?:ID )?(\d+)")
_TAG_PG_NAME = re.compile(r"\(([^()]+)\)")
_ARG_INT = {
    "seq": re.compile(r"SeqNum=(\d+)"),
    "timeout_ms": re.compile(r"Timeout\(ms\)=(\d+)"),
    "numel_in": re.compile(r"NumelIn=(\d+)"),
    "numel_out": re.compile(r"NumelOut=(\d+)"),
}
_ARG_OP = re.compile(r"OpType=(\w+)")

_NCCL_LINE = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>[\w./-]+:\d+) )?NCCL WARN (?P<msg>.*)"
)
_IB = re.compile(
    r"Got completion (?:from peer (?:(?P<peer>[^\s<]+)(?:<(?P<port>\d+)>)? )?)?with "
    r"(?:error (?P<err>\d+)|status=(?P<status>\d+))"
)
_IB_OPCODE = re.compile(r"opcode[= ](\d+)")
_IB_LEN = re.compile(r"\blen[= ](\d+)")
_IB_VENDOR = re.compile(r"vendor err (\d+)")
_IB_DIR = re.compile(r"\((Send|Recv)\)")
_IB_LGID = re.compile(r"localGid\s*(\S+)")
_IB_RGID = re.compile(r"remoteGids?\s*(\S+)")
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
_NCCL_CODE = re.compile(
    r"\bnccl(RemoteError|SystemError|InternalError|InvalidArgument|InvalidUsage|UnhandledCudaError)\b"
)
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
_NCCL_ERROR_HINT = re.compile(
    r"NCCL error|NCCL communicator was aborted|DistBackendError|ncclCommAbort|NCCL Error \d|"
    r"\bnccl(?:RemoteError|SystemError|InternalError|InvalidArgument|InvalidUsage|UnhandledCudaError)\b"
)
_SOCKET = re.compile(
    r"(?i)socket\w*:|connect to \S+ failed|connection closed by remote peer|socket recv failed|"
    r"connection refused|connection reset|connection abort|failed to execute operation connect"
)
_PEER = re.compile(r"(?:to|peer) ([\w.:%-]+?)<(\d+)>")

_CUDA_ERR = re.compile(r"CUDA error: (.+?)(?:\s+CUDA kernel errors|\s+Search for `cuda|\s*$)")
_CUDA_DRIVER = re.compile(r"\b(CUDA_ERROR_[A-Z_]+)(?::\s*([^.:]+))?")
_CUDA_RUNTIME = re.compile(r"\b(cudaError[A-Z]\w+)")
_CUDA_FAILURE = re.compile(r"Cuda failure '?([^']+?)'?(?:\s*$|\s+\()")
_CUBLAS = re.compile(r"\b((?:CUBLAS|CUDNN)_STATUS_[A-Z_]+)")
_CUDA_NAMES: tuple[tuple[str, str], ...] = (
    ("illegal memory access", "illegal_memory_access"),
    ("uncorrectable ecc error", "ecc_uncorrectable"),
    ("ecc_uncorrectable", "ecc_uncorrectable"),
    ("unspecified launch failure", "launch_failure"),
    ("launch_failed", "launch_failure"),
    ("device-side assert triggered", "device_assert"),
    ("misaligned address", "misaligned_address"),
    ("illegal instruction", "illegal_instruction"),
    ("launch timed out", "launch_timeout"),
    ("no kernel image is available", "no_kernel_image"),
    ("invalid device ordinal", "invalid_device_ordinal"),
    ("busy or unavailable", "devices_unavailable"),
    ("no cuda-capable device", "no_device"),
    ("nvlink error", "nvlink_uncorrectable"),
    ("initialization error", "initialization_error"),
    ("operation not permitted when stream is capturing", "stream_capture"),
    ("invalid argument", "invalid_argument"),
    ("unknown error", "unknown_error"),
    ("out of memory", "out_of_memory"),
)
_OOM = re.compile(
    r"(?:CUDA|HIP|XPU|MPS) out of memory|OutOfMemoryError|CUDA error: out of memory|Cuda failure 'out of memory'"
)
_OOM_TRIED = re.compile(r"Tried to allocate ([\d.]+ ?(?:[KMGTP]i?B|bytes|B))")
_OOM_GPU = re.compile(r"\bGPU (\d+)")
_OOM_TOTAL = re.compile(
    r"total capac\w* of ([\d.]+ ?(?:[KMGTP]i?B|bytes|B))|([\d.]+ ?(?:[KMGTP]i?B|bytes|B)) total capacity"
)
_OOM_FREE = re.compile(r"of which ([\d.]+ ?(?:[KMGTP]i?B|bytes|B)) is free|([\d.]+ ?(?:[KMGTP]i?B|bytes|B)) free")
_SIZE = re.compile(r"([\d.]+) ?([KMGTP]?)i?(B|bytes)")

_DL_KILLED = re.compile(
    r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited unexpectedly)"
)
_DL_BUS = re.compile(r"(?i)unexpected bus error encountered in worker")

_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")
_STORE_TIMEOUT = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
_STORE_WAIT = re.compile(r"(?i)wait timeout after (\d+)ms, keys?: (\S+)")
_MONITORED_BARRIER = re.compile(r"Rank (\d+) failed to pass monitoredBarrier in (\d+) ms")

_EL_HEARTBEAT = re.compile(
    r"The node '([^']+)' has failed to send a keep-alive heartbeat to the rendezvous '([^']+)'"
    r"(?: due to an error of type (\w+))?"
)
_EL_SHUTDOWN = re.compile(r"The node '([^']+)' has failed to shutdown the rendezvous '([^']*)")
_EL_TYPE = re.compile(r"\b(Rendezvous\w*Error|DistStoreError|DistNetworkError|RendezvousGracefulExitError)\b")
_EL_CLOSING = re.compile(r"Sending process (\d+) closing signal (\w+)")
_EL_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of binary: (\S+)")
_EL_GROUP = re.compile(r"Worker group FAILED\. (\d+)/(\d+) attempts left")
_EL_HINTS = (
    "endezvous",
    "DistStoreError",
    "DistNetworkError",
    "10d store",
    "closing signal",
    "Worker group FAILED",
    "local_rank: ",
)

_CRASH_FATAL_PY = re.compile(r"Fatal Python error: (.+)")
_CRASH_SIGNAL = re.compile(
    r"(?:^|\s)(Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception|Killed)"
    r"(?: \(core dumped\))?(?:\s+\S.{0,300})?$"
)
_CRASH_REASON = {
    "Segmentation fault": "segfault",
    "Aborted": "abort",
    "Bus error": "bus_error",
    "Illegal instruction": "illegal_instruction",
    "Floating point exception": "fpe",
    "Killed": "killed",
}
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_CPP_RAISED = re.compile(r"Exception raised from (\S+) at (\S+?) \(most recent call first\):")

_NAN_LOSS = re.compile(r"(?i)\bloss\b[^|\n]{0,40}?\b(?:nan|inf)\b|\b(?:nan|inf)\b[^|\n]{0,20}?\bloss\b")
_NAN_GRAD = re.compile(
    r"(?i)\bgrad(?:ient)?s?[ _-]?norm\b[^|\n]{0,40}?\b(?:nan|inf)\b"
    r"|\b(?:nan|inf)\b[^|\n]{0,40}?\bgrad(?:ient)?s?[ _-]?norm\b"
)
_MSG_RANK = re.compile(r"(?i)\brank(?: id)?[:= ]\s*(\d{1,6})\b")
_DEVICE = re.compile(r"\bDevice:? (\d+)")

_ERROR_LEVELS = frozenset({"E", "F", "ERROR", "CRITICAL"})
_ERRORISH = re.compile(
    r"(?:Error|Exception)\b|\berror:|\b(?:ERROR|FATAL|Fatal|failed|Failed|FAILED|Killed|Segmentation fault|core dumped"
    r"|panic)\b"
)
# Substrings one of which every _ERRORISH match contains: a C-speed test before the regex.
_ERROR_WORDS = (
    "rror",
    "xception",
    "ERROR",
    "FATAL",
    "Fatal",
    "ailed",
    "FAILED",
    "Killed",
    "Segmentation",
    "core dumped",
    "panic",
)
# Cheap literal hints for the default step patterns (tested against the lowercased line).
_STEP_HINTS = dict(zip(DEFAULT_STEP_PATTERNS, ("iteration", "{'loss'", "%|", "step"), strict=True))
# Lines that accompany errors already reported by another line: not news.
_BOILERPLATE = (
    "CUDA kernel errors might be asynchronously reported",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING",
    "Compile with `TORCH_USE_CUDA_DSA`",
    "Some NCCL operations have failed or timed out",
    "To avoid data inconsistency, we are taking the entire process down",
    "To enable traceback see:",
    "Details are lost due to multiprocessing",
    # torchrun's agent, copying a worker's error file: the ChildFailedError summary reports the failure.
    "no error file defined for parent, to copy child error file",
)

# -- blocks ----------------------------------------------------------------------------------------

_TB_START = "Traceback (most recent call last):"
_TB_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_TB_FRAME = re.compile(r'\s*File "([^"]*)", line (\d+), in (.+?)\s*$')
_TB_EXC = re.compile(r"([A-Za-z_][\w.]*(?:::\w+)*)(?::(?: (.*)|\s*$)|\s*$)")
_CF_HEADER = re.compile(r"(?:^|\.)ChildFailedError:?\s*$")
_CF_KV = re.compile(r"\s+(\w[\w ]*?)\s*: ?(.*)$")
_CF_ENTRY = re.compile(r"\[(\d+)\]:\s*$")
_CF_RANK = re.compile(r"(-?\d+)(?: \(local_rank: (\d+)\))?")
_CF_EXIT = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_CF_SIGNAL = re.compile(r"Signal (\d+) \((\w+)\)")
_CF_EXIT_SIGNAL = re.compile(r"\((SIG[A-Z0-9]+)\)")  # "-15 (pid: 15977)  (SIGTERM)" (PyTorch 2.x)
# Keys of a failure entry (PyTorch 1.9-1.10 wrote "msg", later ones "traceback"); the message, always
# last, may go on over indented lines (the worker's traceback from its error file): those are its own.
_CF_KEYS = frozenset({"time", "host", "rank", "exitcode", "error_file", "traceback", "msg"})
_CF_MULTILINE = frozenset({"traceback", "msg"})
_CF_NA = "<N/A>"
_DESYNC_START = re.compile(r"Timeout at collective: (\w+), #(\d+)|the lagging/dead/mismatched ranks")
_DESYNC_REPORTER = re.compile(r"\[(\d+)\] Timeout at collective")
_DESYNC_RANKS = re.compile(r"\[(\d+)\]")
_DESYNC_STACK = re.compile(r"#\d+ \S+ from \S+")


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.strip().rstrip(",|;)]}'\""))
    except ValueError:
        return None


def _wire(value: float) -> float | str:
    """JSON has no NaN or infinity: non-finite values travel as "nan", "inf", "-inf"."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _size(text: str | None) -> int | None:
    if not text:
        return None
    m = _SIZE.search(text)
    if not m:
        return None
    try:
        return int(float(m.group(1)) * 1024 ** "_KMGTP".index(m.group(2) or "_"))
    except ValueError:
        return None


def _cuda_name(message: str) -> str:
    low = message.lower()
    for needle, name in _CUDA_NAMES:
        if needle in low:
            return name
    slug = re.sub(r"[^a-z0-9]+", "_", low).strip("_")
    return slug[:48] or "unknown"


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


class _Block:
    """A multi-line message being collected for one prefix (one rank's output)."""

    kind = "block"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        self.ts = ts
        self.rank = rank
        self.raws: list[str] = []
        self.omitted = 0
        self.last_line_no = line_no
        self.last_update = now
        self.local_rank: int | None = None  # from a "[default3]:" prefix

    def add(self, raw: str) -> None:
        if len(self.raws) < _MAX_BLOCK_LINES:
            self.raws.append(raw)
        else:
            self.omitted += 1

    @property
    def text(self) -> str:
        text = "\n".join(self.raws)
        if self.omitted:
            text += f"\n... [{self.omitted} more lines]"
        return clip(text, MAX_EVENT_LINE)

    def offer(self, body: str) -> int:
        """TAKE (the line is part of the block), TAKE_DONE (... and the last of it) or REJECT."""
        raise NotImplementedError


TAKE, TAKE_DONE, REJECT = 1, 2, 0


class _Traceback(_Block):
    kind = "traceback"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        super().__init__(ts, rank, line_no, now)
        self.state = "frames"  # frames -> exc -> gap (blank lines that may lead to a chained part)
        self.frames: deque[dict[str, Any]] = deque(maxlen=_MAX_FRAMES)
        self.n_frames = 0
        self.exc_lines: list[str] = []  # every exception line, chained ones first
        self.tail: list[str] = []  # continuation of the last exception's message (C++ frames ...)

    def offer(self, body: str) -> int:
        stripped = body.strip()
        if self.state == "frames":
            if not stripped or body[0].isspace():
                frame = _TB_FRAME.match(body)
                if frame:
                    self.n_frames += 1
                    self.frames.append(
                        {"file": frame.group(1), "line": int(frame.group(2)), "function": frame.group(3)}
                    )
                return TAKE
            if stripped.startswith(_TB_START) or stripped in _TB_CHAIN:
                return TAKE
            if _is_exception_line(stripped):
                self.exc_lines.append(stripped)
                self.tail = []
                self.state = "exc"
                return TAKE
            return REJECT
        if self.state in ("exc", "gap"):
            if not stripped:
                self.state = "gap"
                return TAKE
            if stripped in _TB_CHAIN or (self.state == "gap" and stripped.startswith(_TB_START)):
                self.state = "frames"
                return TAKE
            after_last_error = self.tail[-1:] == ["Last error:"]
            if self.state == "exc" and (after_last_error or _continues_message(stripped)):
                self.tail.append(stripped)
                return TAKE
        return REJECT


class _ChildFailed(_Block):
    """torchrun's failure table, from "...ChildFailedError:" to the closing "=====" line.

    Sections: "Failures:" (PyTorch >= 1.11; "Other Failures:" before) and "Root Cause ...", each a
    list of "[N]:" entries (N is the index in the section, not the rank) of "key : value" lines. An
    entry's message (its last key) may be a whole traceback, indented by two spaces, ending with the
    exception line and a line of spaces: it belongs to the entry.
    """

    kind = "child_failed"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        super().__init__(ts, rank, line_no, now)
        self.rules = 0
        self.section = "failures"
        self.entries: list[tuple[str, dict[str, str]]] = []
        self.last_key: str | None = None  # the entry's key the next indented line may continue
        self.traceback: _Traceback | None = None  # the torchrun stack printed before the table

    def offer(self, body: str) -> int:
        stripped = body.strip()
        continuing = self.last_key in _CF_MULTILINE and bool(self.entries)
        indented = not stripped or body[0].isspace()
        if stripped and set(stripped) == {"="}:
            self.rules += 1
            self.last_key = None
            return TAKE_DONE if self.rules >= 2 else TAKE
        if stripped and set(stripped) == {"-"}:
            self.last_key = None
            return TAKE
        if not (continuing and indented):
            if stripped.startswith(("Failures:", "Other Failures:")):
                self.section, self.last_key = "failures", None
                return TAKE
            if stripped.startswith("Root Cause"):
                self.section, self.last_key = "root", None
                return TAKE
            if stripped.startswith("<NO_OTHER_FAILURES>"):
                self.last_key = None
                return TAKE
            if _CF_ENTRY.match(stripped):
                self.entries.append((self.section, {}))
                self.last_key = None
                return TAKE
        kv = _CF_KV.match(body)
        if kv and self.entries:
            key = kv.group(1).strip()
            if not continuing or key in _CF_KEYS:
                self.entries[-1][1][key] = kv.group(2).strip()
                self.last_key = key
                return TAKE
        if continuing and indented:
            assert self.last_key is not None
            entry = self.entries[-1][1]
            line = body.rstrip()
            entry[self.last_key] += "\n" + (line[2:] if line.startswith("  ") else line.lstrip())
            return TAKE
        if self.rules == 1 and not self.entries and stripped.endswith("FAILED"):
            return TAKE  # the title: "run.py FAILED"
        return REJECT


class _Crash(_Block):
    """`terminate called after throwing an instance of 'X'` and its `what():` message and C++ frames."""

    kind = "crash"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime, exc_type: str) -> None:
        super().__init__(ts, rank, line_no, now)
        self.exc_type = exc_type
        self.what: str | None = None
        self.raised: re.Match[str] | None = None
        self.cpp_frames = 0

    def offer(self, body: str) -> int:
        stripped = body.strip()
        if stripped.startswith("what():") and self.what is None:
            self.what = stripped.removeprefix("what():").strip()
            return TAKE
        if stripped.startswith("frame #"):
            self.cpp_frames += 1
            return TAKE
        raised = _CPP_RAISED.search(stripped)
        if raised:
            self.raised = self.raised or raised
            return TAKE
        if self.what is not None and stripped.startswith(_BOILERPLATE):
            return TAKE
        return REJECT


class _CppException(_Block):
    """A C++ stack dump with no header we saw: "Exception raised from F at file:line ..." and frames."""

    kind = "cpp_exception"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime, raised: re.Match[str]) -> None:
        super().__init__(ts, rank, line_no, now)
        self.function = raised.group(1)
        self.src = raised.group(2)
        self.frames: list[str] = []

    def offer(self, body: str) -> int:
        stripped = body.strip()
        if stripped.startswith("frame #"):
            if len(self.frames) < _MAX_FRAMES:
                self.frames.append(stripped.split(":", 1)[-1].strip())
            return TAKE
        return REJECT


class _Desync(_Block):
    """ProcessGroupNCCL's desync report (TORCH_NCCL_DESYNC_DEBUG=1): who lagged, and where."""

    kind = "desync_report"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        super().__init__(ts, rank, line_no, now)
        self.op: str | None = None
        self.collective: int | None = None
        self.reporter: int | None = None
        self.ranks: list[int] = []
        self.details: list[str] = []
        self.stack: list[str] = []
        self.in_stack = False

    def offer(self, body: str) -> int:
        stripped = body.strip().removeprefix("- ").strip()
        m = _DESYNC_START.search(stripped)
        if m:
            if m.group(1):
                self.op, self.collective = m.group(1), int(m.group(2))
                reporter = _DESYNC_REPORTER.search(stripped)
                if reporter:
                    self.reporter = int(reporter.group(1))
            return TAKE
        if stripped.startswith("Stack trace of the failed collective"):
            self.in_stack = True
            return TAKE
        if self.in_stack and _DESYNC_STACK.match(stripped):
            if len(self.stack) < _MAX_FRAMES:
                self.stack.append(stripped)
            return TAKE
        if not self.in_stack and stripped.startswith("[") and _DESYNC_RANKS.match(stripped):
            self.details.append(stripped)
            for r in _DESYNC_RANKS.findall(stripped.split("]", 1)[0] + "]"):
                if int(r) not in self.ranks:
                    self.ranks.append(int(r))
            return TAKE
        if not self.in_stack and stripped.startswith(("Snapshot of ranks", "No desync", "Rank ")):
            self.details.append(stripped)
            return TAKE
        return REJECT


def _cf_value(text: str | None) -> str | None:
    text = (text or "").strip().strip('"').strip()
    return None if not text or text == _CF_NA else text


def _cf_message(entry: dict[str, str]) -> str | None:
    return _cf_value(entry.get("traceback", entry.get("msg")))


def _cf_entry(entry: dict[str, str]) -> dict[str, Any]:
    """One failure of the ChildFailedError table: rank, local_rank, exitcode, pid, signal."""
    info: dict[str, Any] = {"rank": None, "local_rank": None, "exitcode": None, "pid": None, "signal": None}
    m = _CF_RANK.match(entry.get("rank", ""))
    if m:
        info["rank"] = int(m.group(1))
        info["local_rank"] = int(m.group(2)) if m.group(2) else None
    exitcode = entry.get("exitcode", "")
    m = _CF_EXIT.match(exitcode)
    if m:
        info["exitcode"] = int(m.group(1))
        info["pid"] = int(m.group(2)) if m.group(2) else None
    message = _cf_message(entry) or ""
    sig = _CF_SIGNAL.search(message.split("\n", 1)[0])  # "Signal 6 (SIGABRT) received by PID 32051"
    named = _CF_EXIT_SIGNAL.search(exitcode)
    if sig:
        info["signal"] = sig.group(2)
    elif named:
        info["signal"] = named.group(1)
    elif info["exitcode"] is not None and info["exitcode"] < 0:
        info["signal"] = _signal_name(-info["exitcode"])  # torchrun reports "killed by N" as -N
    return info


def _read_traceback(text: str, ts: datetime) -> _Traceback | None:
    """A Python traceback given as text (a worker's error file in the ChildFailedError table)."""
    lines = text.split("\n")
    if not lines[0].strip().startswith(_TB_START):
        return None
    tb = _Traceback(ts, None, 0, ts)
    tb.add(lines[0])
    for line in lines[1:]:
        if tb.offer(line) == REJECT:
            break
        tb.add(line)
    return tb


def _is_exception_line(text: str) -> bool:
    m = _TB_EXC.match(text)
    if not m:
        return False
    name = m.group(1)
    # "INFO:root:..." and other log lines start like an exception; exception names are not shouted.
    return not name.isupper()


def _continues_message(text: str) -> bool:
    """Lines that go on an exception's message: C++ frames, CUDA hints, NCCL's code and "Last error:"."""
    return text.startswith(("frame #", "Exception raised from", "Last error:", "nccl", *_BOILERPLATE))


class TrainingLogParser:
    """Turns training log lines into events; see the module docstring."""

    def __init__(
        self,
        *,
        step_patterns: Sequence[str] = DEFAULT_STEP_PATTERNS,
        spike_factor: float = 5.0,
        path: str | None = None,
    ) -> None:
        self.path = path
        self.spike_factor = spike_factor
        self.parse_errors = 0  # lines the parser choked on (a bug, counted rather than raised)
        # (regex, literal the lowercased line must contain or None): user patterns get no hint.
        self.step_patterns: list[tuple[re.Pattern[str], str | None]] = []
        for pattern in step_patterns:
            compiled = re.compile(pattern)
            if "step" not in compiled.groupindex:
                raise ValueError(f"step pattern has no named group 'step': {pattern!r}")
            self.step_patterns.append((compiled, _STEP_HINTS.get(pattern)))
        self.last_step: int | None = None
        self._history: dict[str, deque[float]] = {"loss": deque(maxlen=_WINDOW), "grad_norm": deque(maxlen=_WINDOW)}
        self._blocks: dict[str, _Block] = {}  # pending multi-line blocks by line prefix (one per rank)
        self._ib: tuple[datetime, int | None, str, str] | None = None  # an IB error line cut in two
        self._timeouts: set[tuple[Any, ...]] = set()  # watchdog timeouts reported, to drop PyTorch's repeat
        self._line_no = 0

    # -- public ------------------------------------------------------------------------------------

    def feed(self, line: str, *, now: datetime) -> list[Event]:
        try:
            return self._feed(line, as_utc(now))
        except Exception:  # a log line must never take the agent down
            self.parse_errors += 1
            log.debug("training parser failed on %r", line[:200], exc_info=True)
            return []

    def flush(self, *, now: datetime) -> list[Event]:
        events: list[Event] = []
        try:
            events += self._finish_ib()
            for _ in range(2):  # a traceback ending in ChildFailedError hands over to its table once
                for key in list(self._blocks):
                    events += self._finish(key)
        except Exception:
            self.parse_errors += 1
            self._blocks.clear()
            log.debug("training parser failed to flush", exc_info=True)
        return events

    # -- per line ----------------------------------------------------------------------------------

    def _feed(self, raw: str, now: datetime) -> list[Event]:
        raw = raw.rstrip("\r\n")
        self._line_no += 1
        if "\r" in raw:  # a progress bar redrawn in place: only the last drawing matters
            raw = next((seg for seg in reversed(raw.split("\r")) if seg.strip()), "")
        text = match_window(raw)
        ts, rank, local_rank, key, body, level = self._strip(text, now)
        events: list[Event] = []
        if self._ib is not None:
            merged = self._merge_ib(raw, body)
            events += self._finish_ib()
            if merged:
                return events
        # A pending block of this prefix takes the line, or ends; ending a traceback may turn it into
        # the ChildFailed table that follows it, which then gets the line (hence at most two rounds).
        for _ in range(2):
            block = self._blocks.get(key)
            if block is None:
                break
            verdict = block.offer(body)
            if verdict != REJECT:
                block.add(raw)
                block.last_line_no, block.last_update = self._line_no, now
                if verdict == TAKE_DONE:
                    events += self._finish(key)
                return events + self._finish_stale(now)
            events += self._finish(key)
        events += self._finish_stale(now)
        if self._start_block(key, raw, body, ts, rank, local_rank, now):
            return events
        events += self._line(raw, body, ts, rank, local_rank, level)
        return events

    def _strip(self, text: str, now: datetime) -> tuple[datetime, int | None, int | None, str, str, str | None]:
        """Peel launcher and logger prefixes: (time, rank, local rank, block key, message, log level)."""
        ts: datetime | None = None
        rank: int | None = None
        local_rank: int | None = None
        level: str | None = None
        key = ""
        body = text
        for _ in range(6):
            m = _P_PID.match(body)
            if m:
                body = body[m.end() :]
                continue
            m = _P_TORCHRUN.match(body)
            if m:
                # torchrun's own tee prefix is "[{role}{local_rank}]:" (e.g. "[default3]:"); "[rank3]:"
                # is the global rank (PyTorch's rank-prefixed output and log_line_prefix_template).
                if m.group(1) == "rank":
                    rank = int(m.group(2))
                else:
                    local_rank = int(m.group(2))
                key += m.group(0).strip()
                body = body[m.end() :]
                continue
            if not key:
                m = _P_SRUN.match(body)
                if m:
                    rank = int(m.group(1))
                    key = m.group(1) + ":"
                    body = body[m.end() :]
                    continue
            m = _P_LEVEL.match(body)
            if m:
                level = m.group(1)
                body = body[m.end() :]
                continue
            if ts is None and body and body[0] in " [0123456789":
                m = _P_ISO.match(body)
                if m:
                    ts = _iso(m)
                    body = body[m.end() :]
                    continue
            if body and body[0] in "[IWEF":
                m = _P_GLOG.match(body)
                if m:
                    ts = ts or _glog(m, now)
                    level = level or m.group(1)
                    body = body[m.end() :]
                    continue
                m = _P_C10.match(body)
                if m:
                    level = level or m.group(1)
                    body = body[m.end() :]
                    continue
            break
        return ts or now, rank, local_rank, key, body, level

    def _start_block(
        self, key: str, raw: str, body: str, ts: datetime, rank: int | None, local_rank: int | None, now: datetime
    ) -> bool:
        stripped = body.strip()
        block: _Block | None = None
        if stripped.startswith(_TB_START):
            block = _Traceback(ts, rank, self._line_no, now)
        elif "ChildFailedError" in stripped and _CF_HEADER.search(stripped):
            block = _ChildFailed(ts, rank, self._line_no, now)
        elif "terminate called after throwing" in stripped:
            m = _TERMINATE.search(stripped)
            if m:
                block = _Crash(ts, rank, self._line_no, now, m.group(1))
        elif stripped.startswith("Exception raised from"):
            m = _CPP_RAISED.match(stripped)
            if m:
                block = _CppException(ts, rank, self._line_no, now, m)
        elif ("Timeout at collective" in stripped or "lagging/dead/mismatched" in stripped) and _DESYNC_START.search(
            stripped
        ):
            block = _Desync(ts, rank, self._line_no, now)
            block.offer(body)
        if block is None:
            return False
        block.local_rank = local_rank
        block.add(raw)
        self._blocks[key] = block
        return True

    def _finish_stale(self, now: datetime) -> list[Event]:
        events: list[Event] = []
        if not self._blocks:
            return events
        for key, block in list(self._blocks.items()):
            if (
                self._line_no - block.last_line_no > _STALE_LINES
                or (now - block.last_update).total_seconds() > _STALE_SECONDS
            ):
                events += self._finish(key)
        return events

    # -- block endings -----------------------------------------------------------------------------

    def _finish(self, key: str) -> list[Event]:
        block = self._blocks.get(key)
        events = self._finish_block(key)
        if block is not None and block.local_rank is not None:
            for event in events:
                event.fields.setdefault("local_rank", block.local_rank)
        return events

    def _finish_block(self, key: str) -> list[Event]:
        block = self._blocks.pop(key, None)
        if block is None:
            return []
        if isinstance(block, _Traceback):
            if block.exc_lines and _CF_HEADER.search(block.exc_lines[-1]):
                # The torchrun agent's own stack ends in ChildFailedError: its table follows. One event.
                cf = _ChildFailed(block.ts, block.rank, block.last_line_no, block.last_update)
                cf.raws, cf.omitted, cf.traceback, cf.local_rank = block.raws, block.omitted, block, block.local_rank
                self._blocks[key] = cf
                return []
            return [self._traceback_event(block)]
        if isinstance(block, _ChildFailed):
            return [self._child_failed_event(block)]
        if isinstance(block, _Crash):
            return [self._crash_event(block)]
        if isinstance(block, _CppException):
            fields: dict[str, Any] = {"function": block.function, "src": block.src, "frames": block.frames}
            return [self._event(block.ts, "cpp_exception", block.text, "error", fields, block.rank, critical=True)]
        if isinstance(block, _Desync):
            fields = {
                "op": block.op,
                "collective": block.collective,
                "reporter_rank": block.reporter,
                "lagging_ranks": block.ranks,
                "details": block.details[:50],
                "stack": block.stack,
            }
            rank = block.rank if block.rank is not None else block.reporter
            return [self._event(block.ts, "desync_report", block.text, "error", fields, rank)]
        return []

    def _specific(self, text: str, ts: datetime) -> tuple[dict[str, Any] | None, int | None]:
        """The most specific single-line reading of an exception message, as a dict with its kind.

        Only a NCCL error that carries an IB completion error reads two ways: the NCCL error wins, the
        IB one rides along under "related".
        """
        found = [e for e in self._classify(text, text, ts, None, None) if e.kind != "unmatched_error"]
        if not found:
            return None, None
        main = found[-1]
        error: dict[str, Any] = {"kind": main.kind, **main.fields}
        if len(found) > 1:
            error["related"] = [{"kind": e.kind, **e.fields} for e in found[:-1]]
        return error, main.rank

    def _traceback_event(self, block: _Traceback) -> Event:
        fields: dict[str, Any] = {"exc_type": None, "exc_message": None}
        rank = block.rank
        if block.exc_lines:
            m = _TB_EXC.match(block.exc_lines[-1])
            if m:
                fields["exc_type"] = m.group(1)
                fields["exc_message"] = (m.group(2) or "")[:2000]
            error, error_rank = self._specific(" ".join([block.exc_lines[-1], *block.tail]), block.ts)
            if error is not None:
                fields["error"] = error
                fields["error_kind"] = error["kind"]
            if rank is None:
                rank = error_rank
            if len(block.exc_lines) > 1:
                fields["chained"] = [line[:500] for line in block.exc_lines[:-1]]
        fields["frames"] = list(block.frames)
        fields["n_frames"] = block.n_frames
        fields["last_frame"] = block.frames[-1] if block.frames else None
        fields["complete"] = bool(block.exc_lines)
        return self._event(block.ts, "traceback", block.text, "error", fields, rank, critical=True)

    def _child_failed_event(self, block: _ChildFailed) -> Event:
        """root_rank: the rank under "Root Cause" (else the first failure), with its details;
        failures: every rank listed, sorted; entries: rank, local rank, exit code, pid and signal of each."""
        roots = [e for section, e in block.entries if section == "root"]
        others = [e for section, e in block.entries if section != "root"]
        root = (roots or others or [{}])[0]
        entries: list[dict[str, Any]] = []
        ranks: set[int] = set()
        for entry in roots + others:
            info = _cf_entry(entry)
            if info["rank"] is not None:
                if info["rank"] in ranks:
                    continue  # listed twice (the root cause among the failures): the first says it
                ranks.add(info["rank"])
            entries.append(info)
        entries.sort(key=lambda e: (e["rank"] is None, e["rank"] or 0))
        info = _cf_entry(root)
        fields: dict[str, Any] = {
            "root_rank": info["rank"],
            "local_rank": info["local_rank"],
            "host": _cf_value(root.get("host")),
            "exitcode": info["exitcode"],
            "pid": info["pid"],
            "signal": info["signal"],
            "time": _cf_value(root.get("time")),
            "error_file": _cf_value(root.get("error_file")),
            "failures": sorted(ranks),
            "entries": entries,
        }
        message = _cf_message(root)
        if message:
            fields["traceback"] = message if len(message) <= 2000 else "..." + message[-2000:]
            tb = _read_traceback(message, block.ts)
            if tb is not None:
                event = self._traceback_event(tb)  # the root rank's own exception, from its error file
                for name in ("exc_type", "exc_message", "error", "error_kind", "last_frame"):
                    if event.fields.get(name) is not None:
                        fields[name] = event.fields[name]
        if block.traceback is not None and block.traceback.frames:
            fields["frames"] = list(block.traceback.frames)  # torchrun's own stack
        ts = block.ts
        when = fields["time"]
        if when:
            with contextlib.suppress(ValueError):  # torchrun's own format; anything else keeps the block's time
                ts = datetime.strptime(when, "%Y-%m-%d_%H:%M:%S").replace(tzinfo=UTC)
        rank = fields["root_rank"] if fields["root_rank"] is not None else block.rank
        return self._event(ts, "child_failed", block.text, "critical", fields, rank, critical=True)

    def _crash_event(self, block: _Crash) -> Event:
        fields: dict[str, Any] = {"reason": "terminate", "exc_type": block.exc_type, "message": block.what}
        rank = block.rank
        if block.what:
            error, error_rank = self._specific(block.what, block.ts)
            if error is not None:
                fields["error"] = error
                fields["error_kind"] = error["kind"]
            if rank is None:
                rank = error_rank
        if block.raised is not None:
            fields["function"] = block.raised.group(1)
            fields["src"] = block.raised.group(2)
        fields["cpp_frames"] = block.cpp_frames
        return self._event(block.ts, "crash", block.text, "error", fields, rank, critical=True)

    # -- IB completion errors cut over two lines ---------------------------------------------------

    def _merge_ib(self, raw: str, body: str) -> bool:
        assert self._ib is not None
        ts, rank, first_raw, first_body = self._ib
        if len(body) > 300 or _NCCL_LINE.search(body) or "NCCL" in body or not body.strip():
            return False
        self._ib = (ts, rank, first_raw + "\n" + raw, first_body.rstrip() + " " + body.strip())
        return True

    def _finish_ib(self) -> list[Event]:
        if self._ib is None:
            return []
        ts, rank, raw, body = self._ib
        self._ib = None
        return self._classify(raw, body, ts, rank, None)

    # -- single lines ------------------------------------------------------------------------------

    def _line(
        self, raw: str, body: str, ts: datetime, rank: int | None, local_rank: int | None, level: str | None
    ) -> list[Event]:
        if "Got completion" in body and "vendor err" not in body and _IB.search(body):
            self._ib = (ts, rank, raw, body)  # NCCL wraps long lines: the rest may be on the next one
            return []
        low = body.lower()
        events = self._steps(raw, body, low, ts, rank)
        events += self._classify(raw, body, ts, rank, local_rank, stepped=bool(events), level=level, low=low)
        return [e for e in events if not self._repeated_timeout(e, body)]

    def _repeated_timeout(self, event: Event, body: str) -> bool:
        """PyTorch prints a timeout again when the watchdog thread dies of it: report it once."""
        if event.kind != "watchdog_timeout":
            return False
        f = event.fields
        key = (event.rank, f.get("rank"), f.get("pg"), f.get("seq"), f.get("op"))
        if "thread terminated with exception" in body and key in self._timeouts:
            return True
        if len(self._timeouts) > 1024:
            self._timeouts.clear()
        self._timeouts.add(key)
        return False

    def _event(
        self,
        ts: datetime,
        kind: str,
        line: str,
        severity: str,
        fields: dict[str, Any],
        rank: int | None,
        *,
        critical: bool = False,
    ) -> Event:
        return Event(
            ts=ts,
            source=SOURCE,
            kind=kind,
            line=clip(line),
            severity=severity,
            fields=fields,
            rank=rank,
            path=self.path,
            critical=critical,
        )

    def _classify(
        self,
        raw: str,
        body: str,
        ts: datetime,
        rank: int | None,
        local_rank: int | None,
        *,
        stepped: bool = False,
        level: str | None = None,
        low: str | None = None,
    ) -> list[Event]:
        """Single-line rules, most specific first; several may apply (a NCCL error carrying an IB one)."""
        events: list[Event] = []

        def emit(
            kind: str, severity: str, fields: dict[str, Any], at: int | None = rank, critical: bool = False
        ) -> None:
            if local_rank is not None:
                fields.setdefault("local_rank", local_rank)
            events.append(self._event(ts, kind, raw, severity, fields, at, critical=critical))

        if "NCCL INFO" in body:
            return events  # NCCL's chatter, including its "-> 6" return-code chains
        if low is None:
            low = body.lower()
        for rule in _RULES:
            if rule(body, low, emit, rank):
                return events
        if not stepped and ("loss" in low or "norm" in low) and ("nan" in low or "inf" in low):
            if _NAN_GRAD.search(body):
                emit("grad_norm_nan", "error", _nan_fields(body), _rank_in(body, rank))
                return events
            if _NAN_LOSS.search(body):
                emit("nan_loss", "error", _nan_fields(body), _rank_in(body, rank))
                return events
        if events:
            return events
        if body.startswith("    ") or body.lstrip().startswith(("frame #", 'File "')) or _is_boilerplate(body):
            return events  # stack frames and source lines of a traceback we did not see begin
        if level in _ERROR_LEVELS or (any(w in body for w in _ERROR_WORDS) and _ERRORISH.search(body)):
            emit("unmatched_error", "warning", {"level": level} if level else {}, _rank_in(body, rank))
        return events

    # -- progress ----------------------------------------------------------------------------------

    def _steps(self, raw: str, body: str, low: str, ts: datetime, rank: int | None) -> list[Event]:
        for pattern, hint in self.step_patterns:
            if hint is not None and hint not in low:
                continue
            m = pattern.search(body)
            if m is None:
                continue
            groups = m.groupdict()
            step = int(groups["step"]) if groups.get("step") else self.last_step
            if step is not None:
                self.last_step = step
            fields: dict[str, Any] = {"step": step}
            if groups.get("total"):
                fields["total"] = int(groups["total"])
            values: dict[str, float] = {}
            for name in ("loss", "grad_norm", "elapsed_ms", "lr"):
                value = _num(groups.get(name))
                if value is not None:
                    values[name] = value
                    fields[name] = _wire(value)
            rank = _rank_in(body, rank)  # "rank=3 step=5 ..." from a plain logging line
            events = [self._event(ts, "step", raw, "debug", fields, rank)]
            for name in ("loss", "grad_norm"):
                if name in values:
                    events += self._judge(name, values[name], step, raw, ts, rank)
            return events
        return []

    def _judge(
        self, name: str, value: float, step: int | None, raw: str, ts: datetime, rank: int | None
    ) -> list[Event]:
        """NaN/inf, or a jump past spike_factor x the recent median: an anomaly event besides the step."""
        prefix = "nan_loss" if name == "loss" else "grad_norm_nan"
        history = self._history[name]
        if not math.isfinite(value):
            fields = {"step": step, name: _wire(value)}
            return [self._event(ts, prefix, raw, "error", fields, rank)]
        events: list[Event] = []
        if len(history) >= _MIN_HISTORY:
            median = statistics.median(history)
            if median > 0 and value > self.spike_factor * median:
                kind = "loss_spike" if name == "loss" else "grad_norm_spike"
                fields = {"step": step, name: value, "median": median, "factor": round(value / median, 2)}
                events.append(self._event(ts, kind, raw, "warning", fields, rank))
        history.append(value)
        return events


# -- single-line rules: each returns True when the line is fully explained ---------------------------

_Emit = Callable[..., None]


def _rule_watchdog(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "atchdog" not in body and "at NCCL work" not in body:
        return False
    m = _WATCHDOG.search(body)
    if m:
        args = m.group("args")
        fields: dict[str, Any] = {}
        for name, regex in _ARG_INT.items():
            found = regex.search(args)
            fields[name] = int(found.group(1)) if found else None
        op = _ARG_OP.search(args)
        fields["op"] = op.group(1) if op else None
        fields["elapsed_ms"] = int(m.group("elapsed")) if m.group("elapsed") else None  # cut-off lines
        fields.update(_tag(m.group("tag")))
        emit("watchdog_timeout", "error", fields, _tag_rank(fields, rank), critical=True)
        return True
    m = _WD_EXC.search(body)
    if m:
        fields = {
            "seq": int(m.group("seq")),
            "last_enqueued": int(m.group("enq")) if m.group("enq") else None,
            "last_completed": int(m.group("done")) if m.group("done") else None,
            "timeout": m.group("timeout") is not None,
        }
        fields.update(_tag(m.group("tag")))
        emit("watchdog_exception", "error", fields, _tag_rank(fields, rank))
        return True
    return False


def _tag(tag: str | None) -> dict[str, Any]:
    """ "[PG ID 0 PG GUID 0(default_pg) Rank 3]", "[PG 1 Rank 0]", "[Rank 3]" -> rank, pg, pg_name."""
    out: dict[str, Any] = {"rank": None, "pg": None}
    if not tag:
        return out
    m = _TAG_RANK.search(tag)
    if m:
        out["rank"] = int(m.group(1))
    m = _TAG_PG.search(tag)
    if m:
        out["pg"] = int(m.group(1))
    m = _TAG_PG_NAME.search(tag)
    if m:
        out["pg_name"] = m.group(1)
    return out


def _tag_rank(fields: dict[str, Any], rank: int | None) -> int | None:
    """The message's rank is the rank in its process group: the global one only in the default group."""
    if rank is not None:
        return rank
    if fields.get("pg") in (None, 0) or fields.get("pg_name") == "default_pg":
        return fields.get("rank")
    return None


def _rule_ib(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "Got completion" not in body:
        return False
    m = _IB.search(body)
    if not m:
        return False
    status = int(m.group("err") or m.group("status"))
    fields: dict[str, Any] = {"status": status, "status_name": IBV_WC_STATUS.get(status)}
    for name, regex in (("opcode", _IB_OPCODE), ("len", _IB_LEN), ("vendor_err", _IB_VENDOR)):
        found = regex.search(body, m.end())
        fields[name] = int(found.group(1)) if found else None
    fields["peer"] = m.group("peer")
    fields["peer_port"] = int(m.group("port")) if m.group("port") else None
    for name, regex in (("direction", _IB_DIR), ("local_gid", _IB_LGID), ("remote_gid", _IB_RGID)):
        found = regex.search(body, m.end())
        if found:
            fields[name] = found.group(1)
    nccl = _NCCL_LINE.search(body)
    if nccl:
        fields.update(_nccl_prefix(nccl))
    emit("ib_error", "error", fields, critical=True)
    # A NCCL error whose "Last error:" is the IB completion: report both.
    return not _NCCL_ERROR_HINT.search(body)


def _nccl_prefix(m: re.Match[str]) -> dict[str, Any]:
    return {
        "host": m.group("host"),
        "pid": int(m.group("pid")),
        "tid": int(m.group("tid")),
        "device": int(m.group("dev")),
        "src": m.group("src"),
    }


def _rule_nccl_warn(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "NCCL WARN" not in body:
        return False
    m = _NCCL_LINE.search(body)
    if not m:
        return False
    fields = _nccl_prefix(m)
    message = m.group("msg").strip()
    fields["message"] = message
    if "Cuda failure" in message or "CUDA failure" in message:
        failure = _CUDA_FAILURE.search(message)
        text = failure.group(1) if failure else message
        if "out of memory" in text:
            emit("oom", "error", {**fields, "tried_bytes": None, "gpu": None}, critical=True)
        else:
            emit("cuda_error", "error", {**fields, "error": _cuda_name(text)}, critical=True)
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


def _rule_nccl_error(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "nccl" not in low or not _NCCL_ERROR_HINT.search(body):
        return False
    fields: dict[str, Any] = {"nccl_code": None}
    m = _NCCL_CODE.search(body)
    if m:
        fields["nccl_code"] = "nccl" + m.group(1)
    else:
        n = _NCCL_ERROR_N.search(body)
        if n:
            fields["nccl_code"] = NCCL_CODES.get(int(n.group(1)))
        else:
            for phrase, code in _NCCL_PHRASES:
                if phrase in low:
                    fields["nccl_code"] = code
                    break
    if "communicator was aborted" in low:
        fields["category"] = "comm_aborted"
    src = _NCCL_ERR_IN.search(body)
    if src:
        fields["src"] = src.group(1)
    version = _NCCL_VERSION.search(body)
    if version:
        fields["nccl_version"] = version.group(1)
    last = _NCCL_LAST.search(body)
    if last:
        fields["last_error"] = last.group(1).strip()
    start = body.find("NCCL error")
    fields["message"] = body[start if start >= 0 else 0 :].strip()[:1000]
    emit("nccl_error", "error", fields, critical=True)
    return True


def _rule_oom(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "memory" not in low or not _OOM.search(body):
        return False
    fields: dict[str, Any] = {"tried_bytes": None, "gpu": None}
    tried = _OOM_TRIED.search(body)
    if tried:
        fields["tried_bytes"] = _size(tried.group(1))
    gpu = _OOM_GPU.search(body)
    if gpu:
        fields["gpu"] = int(gpu.group(1))
    total = _OOM_TOTAL.search(body)
    if total:
        fields["total_bytes"] = _size(total.group(1) or total.group(2))
    free = _OOM_FREE.search(body)
    if free:
        fields["free_bytes"] = _size(free.group(1) or free.group(2))
    start = body.find("out of memory")
    fields["message"] = body[max(0, start - 5) :].strip()[:1000] if start >= 0 else body.strip()[:1000]
    emit("oom", "error", fields, critical=True)
    return True


def _rule_cuda(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "cuda" not in low and "cublas" not in low and "cudnn" not in low and "device-side assert" not in low:
        return False
    fields: dict[str, Any] = {}
    message: str | None = None
    library = _CUBLAS.search(body)
    if library:  # cuBLAS/cuDNN status codes say more than the words around them
        fields["code"] = library.group(1)
    m = _CUDA_ERR.search(body)
    if m:
        message = m.group(1).strip()
    driver = _CUDA_DRIVER.search(body)
    if driver:
        fields["code"] = driver.group(1)
        message = message or (driver.group(2) or driver.group(1)).strip()
    if message is None:
        for regex in (_CUDA_RUNTIME, _CUBLAS, _CUDA_FAILURE):
            found = regex.search(body)
            if found:
                message = found.group(1)
                if regex is not _CUDA_FAILURE:
                    fields["code"] = found.group(1)
                break
    if message is None and "device-side assert triggered" in low:
        message = "device-side assert triggered"
    if message is None:
        return False
    if library:
        error = library.group(1).lower().replace("_status", "")
    else:
        error = _cuda_name(fields.get("code", "") + " " + message)
    fields["error"] = error
    fields["message"] = message[:1000]
    emit("cuda_error", "error", fields, critical=True)
    return True


def _rule_dataloader(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "worker" not in low:
        return False
    m = _DL_KILLED.search(body)
    if m:
        pids = [int(p) for p in re.findall(r"\d+", m.group(1))]
        emit("dataloader_died", "error", {"pids": pids, "signal": (m.group(2) or "").strip() or None}, critical=True)
        return True
    if _DL_BUS.search(body):
        # PyTorch's SIGBUS handler in the worker: almost always /dev/shm too small for the batches.
        emit("dataloader_died", "error", {"pids": [], "signal": "Bus error", "shm": True}, critical=True)
        return True
    return False


def _rule_collective_timeout(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "timed out" not in low and "timeout" not in low and "monitoredBarrier" not in body:
        return False
    m = _GLOO_TIMEOUT.search(body)
    if m:
        fields = {"backend": "gloo" if "gloo" in low else None, "timeout_ms": int(m.group(1)), "op": m.group(2)}
        emit("collective_timeout", "error", fields, critical=True)
        return True
    m = _STORE_TIMEOUT.search(body)
    if m:
        fields = {
            "backend": "store",
            "timeout_ms": int(m.group(1)) * 1000,
            "op": "barrier",
            "joined": int(m.group(2)),
            "expected": int(m.group(3)),
        }
        emit("collective_timeout", "error", fields, critical=True)
        return True
    m = _STORE_WAIT.search(body)
    if m:
        emit(
            "collective_timeout",
            "error",
            {"backend": "store", "timeout_ms": int(m.group(1)), "op": "wait", "keys": m.group(2)},
            critical=True,
        )
        return True
    m = _MONITORED_BARRIER.search(body)
    if m:
        fields = {
            "backend": "gloo",
            "timeout_ms": int(m.group(2)),
            "op": "monitored_barrier",
            "failed_rank": int(m.group(1)),
        }
        emit("collective_timeout", "error", fields, critical=True)
        return True
    return False


def _rule_elastic(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if not any(hint in body for hint in _EL_HINTS):
        return False
    m = _EL_HEARTBEAT.search(body)
    if m:
        fields = {"category": "heartbeat", "node": m.group(1), "rendezvous": m.group(2), "error_type": m.group(3)}
        emit("elastic_error", "error", fields)
        return True
    m = _EL_SHUTDOWN.search(body)
    if m:
        emit(
            "elastic_error", "error", {"category": "rendezvous_shutdown", "node": m.group(1), "rendezvous": m.group(2)}
        )
        return True
    m = _EL_CLOSING.search(body)
    if m:
        emit("elastic_error", "warning", {"category": "closing_signal", "pid": int(m.group(1)), "signal": m.group(2)})
        return True
    m = _EL_WORKER_FAILED.search(body)
    if m:
        fields = {
            "category": "worker_failed",
            "exitcode": int(m.group(1)),
            "local_rank": int(m.group(2)),
            "pid": int(m.group(3)),
            "binary": m.group(4),
        }
        emit("elastic_error", "error", fields)
        return True
    m = _EL_GROUP.search(body)
    if m:
        emit("elastic_error", "warning", {"category": "worker_group_restart", "attempts_left": int(m.group(1))})
        return True
    m = _EL_TYPE.search(body)
    if m or "store has failed" in low:
        category = "store" if ("store" in low or (m and "Store" in m.group(1))) else "rendezvous"
        message = body[m.start() if m else 0 :].strip().rstrip('",')
        emit(
            "elastic_error",
            "error",
            {"category": category, "error_type": m.group(1) if m else None, "message": message[:1000]},
        )
        return True
    return False


def _rule_crash(body: str, low: str, emit: _Emit, rank: int | None) -> bool:
    if "Fatal Python error" in body:
        m = _CRASH_FATAL_PY.search(body)
        if m:
            emit(
                "crash", "error", {"reason": "fatal_python_error", "message": m.group(1).strip()[:1000]}, critical=True
            )
            return True
    if "core dumped" in body or body.strip() in _CRASH_REASON or ": line " in body:
        m = _CRASH_SIGNAL.search(body)
        if m:
            emit("crash", "error", {"reason": _CRASH_REASON[m.group(1)], "message": body.strip()[:1000]}, critical=True)
            return True
    return False


def _nan_fields(body: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"message": body.strip()[:1000]}
    device = _DEVICE.search(body)
    if device:
        fields["device"] = int(device.group(1))
    return fields


def _rank_in(body: str, rank: int | None) -> int | None:
    if rank is not None or ("ank" not in body and "ANK" not in body):
        return rank
    m = _MSG_RANK.search(body)
    return int(m.group(1)) if m else None


def _is_boilerplate(body: str) -> bool:
    return any(b in body for b in _BOILERPLATE)


_RULES: tuple[Callable[[str, str, _Emit, int | None], bool], ...] = (
    _rule_watchdog,
    _rule_ib,
    _rule_nccl_warn,
    _rule_nccl_error,
    _rule_oom,
    _rule_cuda,
    _rule_dataloader,
    _rule_collective_timeout,
    _rule_elastic,
    _rule_crash,
)


def _iso(m: re.Match[str]) -> datetime | None:
    y, mo, d, h, mi, s, frac, tz = m.groups()
    try:
        ts = datetime(
            int(y), int(mo), int(d), int(h), int(mi), int(s), int((frac or "0").ljust(6, "0")[:6]), tzinfo=UTC
        )
    except ValueError:
        return None
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        ts -= sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
    return ts


def _glog(m: re.Match[str], now: datetime) -> datetime | None:
    _, mo, d, h, mi, s, frac = m.groups()
    month, day = int(mo), int(d)
    if not 1 <= month <= 12:
        return None
    try:
        return datetime(
            infer_year(month, day, now), month, day, int(h), int(mi), int(s), int(frac.ljust(6, "0")[:6]), tzinfo=UTC
        )
    except ValueError:
        return None


__all__ = ["DEFAULT_STEP_PATTERNS", "IBV_WC_STATUS", "NCCL_CODES", "TrainingLogParser"]
