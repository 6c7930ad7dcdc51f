"""torchrun's ChildFailedError table: which ranks failed, how, and the root cause's own traceback."""

from __future__ import annotations

import contextlib
import re
import signal
from datetime import UTC, datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import REJECT, TAKE, TAKE_DONE, Block
from agents.parsers.training.common import int_or_none, make_event
from agents.parsers.training.tracebacks import Traceback

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
_CF_TIME = "%Y-%m-%d_%H:%M:%S"  # torchrun's "time" value
_TRACEBACK_CHARS = 2000  # of the root cause's message kept (its end: the exception)
# Fields of the root rank's own traceback that the table's event takes over.
_FROM_TRACEBACK = ("exc_type", "exc_message", "error", "error_kind", "last_frame")


class ChildFailed(Block):
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
        self.traceback: Traceback | None = None  # the torchrun stack printed before the table

    @staticmethod
    def opens(stripped: str) -> bool:
        return "ChildFailedError" in stripped and bool(_CF_HEADER.search(stripped))

    @classmethod
    def after(cls, tb: Traceback) -> ChildFailed | None:
        """The table that follows torchrun's own stack when that ends in ChildFailedError: one event."""
        if not (tb.exc_lines and _CF_HEADER.search(tb.exc_lines[-1])):
            return None
        table = cls(tb.ts, tb.rank, tb.last_line_no, tb.last_update)
        table.raws, table.omitted, table.traceback, table.local_rank = tb.raws, tb.omitted, tb, tb.local_rank
        return table

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

    def event(self, path: str | None) -> Event:
        """root_rank: the rank under "Root Cause" (else the first failure), with its details;
        failures: every rank listed, sorted; entries: rank, local rank, exit code, pid and signal of each."""
        roots = [e for section, e in self.entries if section == "root"]
        others = [e for section, e in self.entries if section != "root"]
        root = (roots or others or [{}])[0]
        entries: list[dict[str, Any]] = []
        ranks: set[int] = set()
        for entry in roots + others:
            info = _entry(entry)
            if info["rank"] is not None:
                if info["rank"] in ranks:
                    continue  # listed twice (the root cause among the failures): the first says it
                ranks.add(info["rank"])
            entries.append(info)
        entries.sort(key=lambda e: (e["rank"] is None, e["rank"] or 0))
        info = _entry(root)
        fields: dict[str, Any] = {
            "root_rank": info["rank"],
            "local_rank": info["local_rank"],
            "host": _value(root.get("host")),
            "exitcode": info["exitcode"],
            "pid": info["pid"],
            "signal": info["signal"],
            "time": _value(root.get("time")),
            "error_file": _value(root.get("error_file")),
            "failures": sorted(ranks),
            "entries": entries,
        }
        message = _message(root)
        if message:
            keep = _TRACEBACK_CHARS
            fields["traceback"] = message if len(message) <= keep else "..." + message[-keep:]
            tb = Traceback.read(message, self.ts)
            if tb is not None:
                own = tb.event(path).fields  # the root rank's own exception, from its error file
                for name in _FROM_TRACEBACK:
                    if own.get(name) is not None:
                        fields[name] = own[name]
        if self.traceback is not None and self.traceback.frames:
            fields["frames"] = list(self.traceback.frames)  # torchrun's own stack
        ts = self.ts
        when = fields["time"]
        if when:
            with contextlib.suppress(ValueError):  # torchrun's own format; anything else keeps the block's time
                ts = datetime.strptime(when, _CF_TIME).replace(tzinfo=UTC)
        rank = fields["root_rank"] if fields["root_rank"] is not None else self.rank
        return make_event(ts, self.kind, self.text, "critical", fields, rank, path=path, critical=True)


def _value(text: str | None) -> str | None:
    text = (text or "").strip().strip('"').strip()
    return None if not text or text == _CF_NA else text


def _message(entry: dict[str, str]) -> str | None:
    return _value(entry.get("traceback", entry.get("msg")))


def _entry(entry: dict[str, str]) -> dict[str, Any]:
    """One failure of the table: rank, local_rank, exitcode, pid, signal."""
    info: dict[str, Any] = {"rank": None, "local_rank": None, "exitcode": None, "pid": None, "signal": None}
    m = _CF_RANK.match(entry.get("rank", ""))
    if m:
        info["rank"] = int(m.group(1))
        info["local_rank"] = int_or_none(m.group(2))
    exitcode = entry.get("exitcode", "")
    m = _CF_EXIT.match(exitcode)
    if m:
        info["exitcode"] = int(m.group(1))
        info["pid"] = int_or_none(m.group(2))
    message = _message(entry) or ""
    sig = _CF_SIGNAL.search(message.split("\n", 1)[0])  # "Signal 6 (SIGABRT) received by PID 32051"
    named = _CF_EXIT_SIGNAL.search(exitcode)
    if sig:
        info["signal"] = sig.group(2)
    elif named:
        info["signal"] = named.group(1)
    elif info["exitcode"] is not None and info["exitcode"] < 0:
        info["signal"] = _signal_name(-info["exitcode"])  # torchrun reports "killed by N" as -N
    return info


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None
