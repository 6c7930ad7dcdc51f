"""Collectives that hang: ProcessGroupNCCL's watchdog timeouts, its stuck-watchdog and flight-recorder dump notices,
its desync report, and Gloo and store timeouts."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import MAX_FRAMES, REJECT, TAKE, Block
from agents.parsers.training.common import Emit, int_or_none, make_event, search_int

# The process-group tag before the message: "[PG ID 0 PG GUID 0(default_pg) Rank 3] ", "[Rank 3] ".
_TAG = r"(?:\[(?P<tag>[^\[\]]{0,120}?Rank \d+)\]\s*)?"
_WATCHDOG = re.compile(
    _TAG + r"Watchdog caught collective operation timeout: "
    r"WorkNCCL\((?P<args>[^()]{0,600}(?:\([^()]{0,20}\)[^()]{0,600})*)\)?(?: ran for (?P<elapsed>\d+) milliseconds)?"
)
# PyTorch 2.2-2.5: "Exception (either an error or timeout) detected by watchdog at work: 5, last enqueued NCCL work:
# 5, last completed NCCL work: 4."; 2.6+: "failure detected by watchdog at work sequence id: 2398459 PG status: last
# enqueued work: 2398578, last completed work: 2398458"
_WD_EXC = re.compile(
    _TAG + r"(?:Exception \(either an error or timeout\) detected by watchdog at work"
    r"|(?P<failure>failure) detected by watchdog at work sequence id"
    r"|(?P<timeout>Timeout) at NCCL work): (?P<seq>\d+)"
    r"(?:,? (?:PG status: )?last enqueued (?:NCCL )?work: (?P<enq>-?\d+))?"
    r"(?:, last completed (?:NCCL )?work: (?P<done>-?\d+))?"
)
# The heartbeat monitor: the watchdog thread itself stopped making progress (a CUDA/NCCL call hangs).
_STUCK = re.compile(
    _TAG + r"(?:\[[^\[\]]{0,120}?Rank \d+\]\s*)?ProcessGroupNCCL's watchdog got stuck for (?P<secs>\d+) seconds"
)
# PyTorch 2.4 on says first which process group noticed: "First PG on this rank that detected no heartbeat of its
# watchdog." (sgl-project/sglang#1691), then "Heartbeat monitor timed out!": both are the monitor's.
_HEARTBEAT = re.compile(
    _TAG + r"(?:Heartbeat monitor timed out!(?:.*?workMetaList_\.size\(\)\s*=\s*(?P<work>\d+))?"
    r"|First PG on this rank that detected no heartbeat of its watchdog)"
)
# The flight recorder's dump: "preparing to dump debug info", "Terminating the process after attempting to dump".
_DUMP = re.compile(
    _TAG + r"(?:\[[^\[\]]{0,120}?Rank \d+\]\s*)?(?:ProcessGroupNCCL (?P<prep>preparing to dump debug info)"
    r"|(?P<term>Terminating the process after attempting to dump debug info)(?:, due to (?P<reason>.+?))?\.?\s*$)"
)
_TAG_RANK = re.compile(r"Rank (\d+)")
_TAG_PG = re.compile(r"PG (?:ID )?(\d+)")
_TAG_PG_NAME = re.compile(r"\(([^()]+)\)")
_WORK_INTS = {  # "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)"
    "seq": re.compile(r"SeqNum=(\d+)"),
    "timeout_ms": re.compile(r"Timeout\(ms\)=(\d+)"),
    "numel_in": re.compile(r"NumelIn=(\d+)"),
    "numel_out": re.compile(r"NumelOut=(\d+)"),
}
_WORK_OP = re.compile(r"OpType=(\w+)")

_DESYNC_START = re.compile(r"Timeout at collective: (\w+), #(\d+)|the lagging/dead/mismatched ranks")
_DESYNC_REPORTER = re.compile(r"\[(\d+)\] Timeout at collective")
_DESYNC_RANKS = re.compile(r"\[(\d+)\]")
_DESYNC_STACK = re.compile(r"#\d+ \S+ from \S+")
_DESYNC_DETAILS = 50  # detail lines kept

_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")
_STORE_TIMEOUT = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
_STORE_WAIT = re.compile(r"(?i)wait timeout after (\d+)ms, keys?: (\S+)")
_MONITORED_BARRIER = re.compile(r"Rank (\d+) failed to pass monitoredBarrier in (\d+) ms")
# c10d's TCPStore client: "The client socket has timed out after 1800s while trying to connect to (127.0.0.1, 48391)."
_STORE_CONNECT = re.compile(
    r"client socket has timed out after (\d+)s while trying to connect to \(([^,()]+), ?(\d+)\)"
)


def rule_watchdog(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if (
        "atchdog" not in body
        and "at NCCL work" not in body
        and "Heartbeat monitor" not in body
        and "no heartbeat" not in body
        and ("dump debug info" not in body)
    ):
        return False
    if "got stuck for" in body or "Heartbeat monitor" in body or "no heartbeat" in body:
        m = _STUCK.search(body) or _HEARTBEAT.search(body)
        if m:
            groups = m.groupdict()
            fields = {
                "category": "watchdog_stuck" if groups.get("secs") is not None else "heartbeat_monitor",
                "timeout_s": int_or_none(groups.get("secs")),
                "pending_work": int_or_none(groups.get("work")),
                **_tag(m.group("tag")),
            }
            emit("watchdog_stuck", "error", fields, _tag_rank(fields, rank), critical=True)
            return True
    if "dump debug info" in body:
        m = _DUMP.search(body)
        if m:
            fields = {"terminating": m.group("term") is not None, "reason": m.group("reason"), **_tag(m.group("tag"))}
            emit("flight_recorder_dump", "warning", fields, _tag_rank(fields, rank))
            return True
    m = _WATCHDOG.search(body)
    if m:
        args = m.group("args")
        fields: dict[str, Any] = {name: search_int(regex, args) for name, regex in _WORK_INTS.items()}
        op = _WORK_OP.search(args)
        fields["op"] = op.group(1) if op else None
        fields["elapsed_ms"] = int_or_none(m.group("elapsed"))  # None on cut-off lines
        fields.update(_tag(m.group("tag")))
        emit("watchdog_timeout", "error", fields, _tag_rank(fields, rank), critical=True)
        return True
    m = _WD_EXC.search(body)
    if m:
        fields = {
            "seq": int(m.group("seq")),
            "last_enqueued": int_or_none(m.group("enq")),
            "last_completed": int_or_none(m.group("done")),
            # The newest wording does not say whether it was a timeout or an error.
            "timeout": None if m.group("failure") else m.group("timeout") is not None,
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


def rule_collective_timeout(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "timed out" not in low and "timeout" not in low and "monitoredBarrier" not in body:
        return False
    fields: dict[str, Any]
    if m := _GLOO_TIMEOUT.search(body):
        fields = {"backend": "gloo" if "gloo" in low else None, "timeout_ms": int(m.group(1)), "op": m.group(2)}
    elif m := _STORE_TIMEOUT.search(body):
        fields = {
            "backend": "store",
            "timeout_ms": int(m.group(1)) * 1000,
            "op": "barrier",
            "joined": int(m.group(2)),
            "expected": int(m.group(3)),
        }
    elif m := _STORE_WAIT.search(body):
        fields = {"backend": "store", "timeout_ms": int(m.group(1)), "op": "wait", "keys": m.group(2)}
    elif m := _STORE_CONNECT.search(body):
        fields = {
            "backend": "store",
            "timeout_ms": int(m.group(1)) * 1000,
            "op": "connect",
            "peer": m.group(2).strip(),
            "peer_port": int(m.group(3)),
        }
    elif m := _MONITORED_BARRIER.search(body):
        fields = {
            "backend": "gloo",
            "timeout_ms": int(m.group(2)),
            "op": "monitored_barrier",
            "failed_rank": int(m.group(1)),
        }
    else:
        return False
    emit("collective_timeout", "error", fields, critical=True)
    return True


class Desync(Block):
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

    @staticmethod
    def opens(stripped: str) -> bool:
        return ("Timeout at collective" in stripped or "lagging/dead/mismatched" in stripped) and bool(
            _DESYNC_START.search(stripped)
        )

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
            if len(self.stack) < MAX_FRAMES:
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

    def event(self, path: str | None) -> Event:
        fields: dict[str, Any] = {
            "op": self.op,
            "collective": self.collective,
            "reporter_rank": self.reporter,
            "lagging_ranks": self.ranks,
            "details": self.details[:_DESYNC_DETAILS],
            "stack": self.stack,
        }
        rank = self.rank if self.rank is not None else self.reporter
        return make_event(self.ts, self.kind, self.text, "error", fields, rank, path=path)
