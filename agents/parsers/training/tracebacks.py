"""Python tracebacks, chained ones included, read into their frames and the exception they end in."""

from __future__ import annotations

import re
from collections import deque
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import MAX_FRAMES, REJECT, TAKE, Block
from agents.parsers.training.classify import add_error
from agents.parsers.training.common import BOILERPLATE, make_event

TB_START = "Traceback (most recent call last):"
_TB_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_TB_FRAME = re.compile(r'\s*File "([^"]*)", line (\d+), in (.+?)\s*$')
_TB_EXC = re.compile(r"([A-Za-z_][\w.]*(?:::\w+)*)(?::(?: (.*)|\s*$)|\s*$)")
_EXC_MESSAGE = 2000  # characters of the exception message kept
_CHAINED_LINE = 500  # characters kept of each chained exception line


class Traceback(Block):
    kind = "traceback"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        super().__init__(ts, rank, line_no, now)
        self.state = "frames"  # frames -> exc -> gap (blank lines that may lead to a chained part)
        self.frames: deque[dict[str, Any]] = deque(maxlen=MAX_FRAMES)
        self.n_frames = 0
        self.exc_lines: list[str] = []  # every exception line, chained ones first
        self.tail: list[str] = []  # continuation of the last exception's message (C++ frames ...)

    @classmethod
    def read(cls, text: str, ts: datetime) -> Traceback | None:
        """A Python traceback given as text (a worker's error file in the ChildFailedError table)."""
        lines = text.split("\n")
        if not lines[0].strip().startswith(TB_START):
            return None
        tb = cls(ts, None, 0, ts)
        tb.add(lines[0])
        for line in lines[1:]:
            if tb.offer(line) == REJECT:
                break
            tb.add(line)
        return tb

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
            if stripped.startswith(TB_START) or stripped in _TB_CHAIN:
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
            if stripped in _TB_CHAIN or (self.state == "gap" and stripped.startswith(TB_START)):
                self.state = "frames"
                return TAKE
            after_last_error = self.tail[-1:] == ["Last error:"]
            if self.state == "exc" and (after_last_error or _continues_message(stripped)):
                self.tail.append(stripped)
                return TAKE
        return REJECT

    def event(self, path: str | None) -> Event:
        fields: dict[str, Any] = {"exc_type": None, "exc_message": None}
        rank = self.rank
        if self.exc_lines:
            m = _TB_EXC.match(self.exc_lines[-1])
            if m:
                fields["exc_type"] = m.group(1)
                fields["exc_message"] = (m.group(2) or "")[:_EXC_MESSAGE]
            error_rank = add_error(fields, " ".join([self.exc_lines[-1], *self.tail]), self.ts)
            if rank is None:
                rank = error_rank
            if len(self.exc_lines) > 1:
                fields["chained"] = [line[:_CHAINED_LINE] for line in self.exc_lines[:-1]]
        fields["frames"] = list(self.frames)
        fields["n_frames"] = self.n_frames
        fields["last_frame"] = self.frames[-1] if self.frames else None
        fields["complete"] = bool(self.exc_lines)
        return make_event(self.ts, self.kind, self.text, "error", fields, rank, path=path, critical=True)


def _is_exception_line(text: str) -> bool:
    m = _TB_EXC.match(text)
    if not m:
        return False
    name = m.group(1)
    # "INFO:root:..." and other log lines start like an exception; exception names are not shouted.
    return not name.isupper()


def _continues_message(text: str) -> bool:
    """Lines that go on an exception's message: C++ frames, CUDA hints, NCCL's code and "Last error:"."""
    return text.startswith(("frame #", "Exception raised from", "Last error:", "nccl", *BOILERPLATE))
