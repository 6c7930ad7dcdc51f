"""The analysis of PyTorch's NCCL flight-recorder dumps (fr_trace / torchfrtrace): which ranks never joined.

Its report of a hang, in the wordings its versions used:

    Not all ranks joining collective 5 at entry 4                 (2.5: collective sequence id, record id)
    Not all ranks joining collective: sequence number: 31117       (2.6)
    Not all ranks joining collective, sequence number: 4           (2.7+)
    Not all ranks joining collective for group 0:default_pg collective nccl:all_reduce Missing ranks are {1}

and of a collective the ranks entered differently (2.6+):

    Collective sequence number: 1487 has errors
    ...
    error msg: Culprit rank 1; Error type: COLLECTIVE_STATE_MISMATCH, Expected state: 'scheduled' does not match ...

followed by `key: value` lines (group info, collective, missing ranks, input/output sizes, world size,
expected ranks, collective state, error msg) and `collective stack trace:` with `function at file:line` frames.
The missing ranks are the ones the others waited for, the culprit ranks the ones whose entry differs (the
analyzer's MatchState: COLLECTIVE_TYPE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH, COLLECTIVE_STATE_MISMATCH,
COLLECTIVE_DTYPE_MISMATCH): the event names them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import MAX_FRAMES, REJECT, TAKE, Block
from agents.parsers.training.common import make_event

_OPEN = "Not all ranks joining collective"
_ERRORS_OPEN = re.compile(r"^Collective sequence number:\s*(\d+) has errors")
_HEADER = re.compile(
    r"Not all ranks joining collective"
    r"(?:[:,]?\s*sequence number:\s*(?P<seq>\d+)|\s+(?P<seq2>\d+) at entry (?P<entry>\d+)"
    r"|\s+for group (?P<group>\S+) collective (?P<op>\S+))?"
    r"(?:.*?Missing ranks are (?P<missing>\{[^}]*\}))?"
)
_KV = re.compile(r"^\s*(?P<key>[a-z][a-z ]{1,40}?)\s*:\s*(?P<value>.*?)\s*$")
_FRAME = re.compile(r"^\s*\S.{0,200}? at \S+:\d+\s*$")
_INTS = re.compile(r"-?\d+")
# "Culprit rank 1; Error type: COLLECTIVE_STATE_MISMATCH, Expected state: ...", joined by ", " when several
_CULPRIT = re.compile(r"Culprit rank (\d+); Error type: (\w+)")
# The report's keys and the field each becomes.
_KEYS = {
    "sequence number": "collective",
    "internal record id": "record_id",
    "group info": "group",
    "collective": "op",
    "missing ranks": "missing_ranks",
    "input sizes": "input_sizes",
    "output sizes": "output_sizes",
    "world size": "world_size",
    "expected ranks": "expected_ranks",
    "collective state": "state",
    "error type": "error_type",
    "error msg": "error_message",
    "total input numel": "input_numel",
    "total output numel": "output_numel",
}


class FlightRecorder(Block):
    """One `Not all ranks joining collective` or `Collective sequence number: N has errors` report of the
    flight-recorder analysis."""

    kind = "flight_recorder"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        super().__init__(ts, rank, line_no, now)
        self.fields: dict[str, Any] = {"error": "not_all_ranks_joined"}
        self.stack: list[str] = []
        self.in_stack = False

    @staticmethod
    def opens(stripped: str) -> bool:
        if "has errors" in stripped and _ERRORS_OPEN.match(stripped):
            return True
        return stripped.startswith(_OPEN) or (_OPEN in stripped and stripped.find(_OPEN) < 40)

    def offer(self, body: str) -> int:
        stripped = body.strip()
        if not self.raws and self.opens(stripped):  # the header (offered before it is added)
            self._header(stripped)
            return TAKE
        if not stripped:
            return REJECT
        if stripped.lower().startswith("collective stack trace"):
            self.in_stack = True
            return TAKE
        if self.in_stack and _FRAME.match(body):
            if len(self.stack) < MAX_FRAMES:
                self.stack.append(stripped)
            return TAKE
        kv = _KV.match(body)
        if kv and kv.group("key").strip() in _KEYS:
            self.in_stack = False
            self._value(_KEYS[kv.group("key").strip()], kv.group("value"))
            return TAKE
        return REJECT

    def _header(self, stripped: str) -> None:
        errors = _ERRORS_OPEN.match(stripped)
        if errors:
            self.fields = {"error": "collective_mismatch", "collective": int(errors.group(1))}
            return
        m = _HEADER.search(stripped)
        if not m:
            return
        seq = m.group("seq") or m.group("seq2")
        if seq:
            self.fields["collective"] = int(seq)
        if m.group("entry"):
            self.fields["record_id"] = int(m.group("entry"))
        if m.group("group"):
            self.fields["group"] = m.group("group")
        if m.group("op"):
            self.fields["op"] = m.group("op")
        if m.group("missing"):
            self._value("missing_ranks", m.group("missing"))

    def _value(self, name: str, value: str) -> None:
        if name in ("missing_ranks", "expected_ranks"):
            ranks = [int(r) for r in _INTS.findall(value)]
            # "expected ranks: 2" (a count, 2.5) vs "expected ranks: {0, 1}" (the set, 2.6+)
            if name == "expected_ranks" and "{" not in value and len(ranks) == 1:
                self.fields["world_size"] = self.fields.get("world_size") or ranks[0]
                return
            self.fields[name] = sorted(set(ranks))
        elif name == "error_message":
            self.fields[name] = value[:500]
            culprits = _CULPRIT.findall(value)
            self.fields["culprit_ranks"] = sorted({int(rank) for rank, _ in culprits})
            self.fields["error_types"] = sorted({kind for _, kind in culprits})
        elif name in ("collective", "record_id", "world_size", "input_numel", "output_numel"):
            found = _INTS.search(value)
            if found:
                self.fields[name] = int(found.group())
        else:
            self.fields[name] = value[:500]

    def event(self, path: str | None) -> Event:
        fields = dict(self.fields)
        fields.setdefault("missing_ranks", [])
        fields["stack"] = self.stack
        return make_event(self.ts, self.kind, self.text, "error", fields, self.rank, path=path)
