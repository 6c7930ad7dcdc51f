"""NCCL RAS reports (`ncclras`, NCCL 2.24+): the communicators' summary table and the errors and warnings under it.

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4         8        32        32   RUNNING  MISMATCH

    Errors
    ======

    Warnings
    ========

    #0-0 (fa93daea854b060b) MISMATCH
      Communicator ranks have different AllGather operation counts
      30 ranks have launched up to operation 640
      2 ranks have launched up to operation 641
      Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124

RAS prints an entry per problem: `#<group>-<comm> (<hash>) MISMATCH|INCOMPLETE|ERROR` for a communicator, `DEAD`
and `TIMEOUT` for the job's processes, each with indented details naming ranks, processes and nodes. A MISMATCH
is a warning in RAS's own words (ranks sampled a moment apart differ; a persistent one is a straggler or ranks
that took different paths); INCOMPLETE, ERROR and DEAD name ranks or processes that stopped answering or failed.
A report whose communicators are all OK makes no event.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import REJECT, TAKE, Block
from agents.parsers.training.common import make_event

_TABLE_HEAD = re.compile(r"^Group\s+Comms\s+Nodes\s+Ranks\b.*\bStatus\s+Errors$")
_SUBHEAD = re.compile(r"^#\s+in group\b")
# "0  1  4  8  32  32  RUNNING  MISMATCH" (ranks per node may be a range: "7-8")
_ROW = re.compile(
    r"^(?P<group>\d+)\s+(?P<comms>\d+)\s+(?P<nodes>\d+)\s+(?P<per_node>\d+(?:-\d+)?)\s+(?P<per_comm>\d+(?:-\d+)?)"
    r"\s+(?P<ranks>\d+)\s+(?P<status>[A-Z][A-Z,]*)\s+(?P<errors>[A-Z][A-Z,]*)$"
)
_ENTRY = re.compile(r"^(?:#(?P<id>\d+-\d+) \((?P<hash>[0-9a-f]+)\) )?(?P<kind>[A-Z]{3,20})$")
_OP = re.compile(r"Communicator ranks have different (\w+) operation counts")
_OP_COUNT = re.compile(r"^(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)")
_RANK = re.compile(
    r"^Rank (?P<rank>\d+)(?: has (?:launched up to operation (?P<op>\d+)|status (?P<status>\w+)))?"
    r"(?: -- GPU (?P<gpu>\S+) managed by process (?P<pid>\d+) on node (?P<node>\S+))?"
)
_PROCESS = re.compile(r"^Process (?P<pid>\d+) on node (?P<node>\S+) managing GPUs? (?P<gpu>.+)$")
_FAILED = frozenset({"INCOMPLETE", "ERROR", "DEAD"})  # the words that say a rank or a process failed
_MAX_DETAILS = 20  # detail lines kept per entry
_MAX_ROWS = 50  # summary rows kept


class NcclRas(Block):
    """One RAS report, from its summary table to the last entry under Errors and Warnings."""

    kind = "nccl_ras"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        super().__init__(ts, rank, line_no, now)
        self.section = "table"
        self.rows: list[dict[str, Any]] = []
        self.issues: list[dict[str, Any]] = []

    @staticmethod
    def opens(stripped: str) -> bool:
        return bool(_TABLE_HEAD.match(stripped))

    def offer(self, body: str) -> int:
        stripped = body.strip()
        if not self.raws or not stripped or (set(stripped) == {"="}):
            return TAKE  # the header (offered before it is added), blank lines and underlines
        if stripped in ("Errors", "Warnings"):
            self.section = stripped.lower()
            return TAKE
        if self.section == "table":
            row = _ROW.match(stripped)
            if row:
                if len(self.rows) < _MAX_ROWS:
                    self.rows.append(_row(row))
                return TAKE
            return TAKE if _SUBHEAD.match(stripped) else REJECT
        entry = _ENTRY.match(stripped)
        if entry and not body[0].isspace():
            issue = {"kind": entry.group("kind"), "section": self.section, "details": []}
            if entry.group("id"):
                issue["comm"], issue["comm_hash"] = "#" + entry.group("id"), entry.group("hash")
            self.issues.append(issue)
            return TAKE
        if body[0].isspace() and self.issues:
            _detail(self.issues[-1], stripped)
            return TAKE
        return REJECT

    def event(self, path: str | None) -> Event | None:
        errors = sorted({e for r in self.rows for e in r["errors"].split(",") if e and e != "OK"})
        kinds = {str(i["kind"]) for i in self.issues}
        if not errors and not self.issues:
            return None  # every communicator OK: nothing to report
        failed = bool((set(errors) | kinds) & _FAILED)
        fields: dict[str, Any] = {
            "errors": errors,
            "statuses": sorted({s for r in self.rows for s in r["status"].split(",") if s}),
            "communicators": self.rows,
            "issues": self.issues,
        }
        severity = "error" if failed else "warning"
        return make_event(self.ts, self.kind, self.text, severity, fields, self.rank, path=path, critical=failed)


def _row(m: re.Match[str]) -> dict[str, Any]:
    return {
        "group": int(m.group("group")),
        "comms": int(m.group("comms")),
        "nodes": int(m.group("nodes")),
        "ranks_per_node": m.group("per_node"),
        "ranks_per_comm": m.group("per_comm"),
        "ranks": int(m.group("ranks")),
        "status": m.group("status"),
        "errors": m.group("errors"),
    }


def _detail(issue: dict[str, Any], line: str) -> None:
    """One indented line under an entry: the collective whose counts differ, how many ranks got how far, and the
    ranks and processes named, with their nodes."""
    if len(issue["details"]) < _MAX_DETAILS:
        issue["details"].append(line)
    if m := _OP.search(line):
        issue["op"] = m.group(1)
    elif m := _OP_COUNT.match(line):
        issue.setdefault("op_counts", []).append({"operation": int(m.group(2) or 0), "ranks": int(m.group(1))})
    elif m := _RANK.match(line):
        _add(issue, "ranks", int(m.group("rank")))
        if m.group("op"):  # a single rank apart: "Rank 7 has launched up to operation 60 -- ..."
            issue.setdefault("op_counts", []).append({"operation": int(m.group("op")), "ranks": 1})
        _where(issue, m)
    elif m := _PROCESS.match(line):
        _where(issue, m)


def _where(issue: dict[str, Any], m: re.Match[str]) -> None:
    if m.group("pid"):
        _add(issue, "processes", int(m.group("pid")))
    if m.group("node"):
        _add(issue, "nodes", m.group("node"))


def _add(issue: dict[str, Any], key: str, value: Any) -> None:
    values = issue.setdefault(key, [])
    if value not in values:
        values.append(value)
