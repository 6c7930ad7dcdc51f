"""C++ exceptions: `terminate called after throwing ...` with its `what():`, and bare C++ stack dumps."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import MAX_FRAMES, REJECT, TAKE, Block
from agents.parsers.training.classify import add_error
from agents.parsers.training.common import BOILERPLATE, make_event

_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_CPP_RAISED = re.compile(r"Exception raised from (\S+) at (\S+?) \(most recent call first\):")


class Terminate(Block):
    """`terminate called after throwing an instance of 'X'` and its `what():` message and C++ frames."""

    kind = "crash"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime, exc_type: str) -> None:
        super().__init__(ts, rank, line_no, now)
        self.exc_type = exc_type
        self.what: str | None = None
        self.raised: re.Match[str] | None = None
        self.cpp_frames = 0

    @classmethod
    def open(cls, stripped: str, ts: datetime, rank: int | None, line_no: int, now: datetime) -> Terminate | None:
        m = _TERMINATE.search(stripped)
        return cls(ts, rank, line_no, now, m.group(1)) if m else None

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
        if self.what is not None and stripped.startswith(BOILERPLATE):
            return TAKE
        return REJECT

    def event(self, path: str | None) -> Event:
        fields: dict[str, Any] = {"reason": "terminate", "exc_type": self.exc_type, "message": self.what}
        rank = self.rank
        if self.what:
            error_rank = add_error(fields, self.what, self.ts)
            if rank is None:
                rank = error_rank
        if self.raised is not None:
            fields["function"] = self.raised.group(1)
            fields["src"] = self.raised.group(2)
        fields["cpp_frames"] = self.cpp_frames
        return make_event(self.ts, self.kind, self.text, "error", fields, rank, path=path, critical=True)


class CppException(Block):
    """A C++ stack dump with no header we saw: "Exception raised from F at file:line ..." and frames."""

    kind = "cpp_exception"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime, raised: re.Match[str]) -> None:
        super().__init__(ts, rank, line_no, now)
        self.function = raised.group(1)
        self.src = raised.group(2)
        self.frames: list[str] = []

    @classmethod
    def open(cls, stripped: str, ts: datetime, rank: int | None, line_no: int, now: datetime) -> CppException | None:
        m = _CPP_RAISED.match(stripped)
        return cls(ts, rank, line_no, now, m) if m else None

    def offer(self, body: str) -> int:
        stripped = body.strip()
        if stripped.startswith("frame #"):
            if len(self.frames) < MAX_FRAMES:
                self.frames.append(stripped.split(":", 1)[-1].strip())
            return TAKE
        return REJECT

    def event(self, path: str | None) -> Event:
        fields: dict[str, Any] = {"function": self.function, "src": self.src, "frames": self.frames}
        return make_event(self.ts, self.kind, self.text, "error", fields, self.rank, path=path, critical=True)
