"""Multi-line messages: the base of the blocks collected line by line, one per prefix (rank)."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from agents.events import Event
from agents.parsers import MAX_EVENT_LINE, clip

MAX_BLOCK_LINES = 2000  # raw lines kept per block; the rest are only counted
MAX_FRAMES = 50  # stack frames kept per block

# What a block says of a line offered to it.
REJECT = 0  # not mine: the block is over, the line is read on its own
TAKE = 1  # part of the block
TAKE_DONE = 2  # part of the block, and its last line


class Block:
    """A multi-line message being collected for one prefix (one rank's output)."""

    kind: ClassVar[str] = "block"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime) -> None:
        self.ts = ts
        self.rank = rank
        self.raws: list[str] = []
        self.omitted = 0
        self.last_line_no = line_no
        self.last_update = now
        self.local_rank: int | None = None  # from a "[default3]:" prefix

    def add(self, raw: str) -> None:
        if len(self.raws) < MAX_BLOCK_LINES:
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
        """TAKE, TAKE_DONE or REJECT the next line of the same prefix (prefixes peeled)."""
        raise NotImplementedError

    def event(self, path: str | None) -> Event | None:
        """The one event the finished block makes; None when it turned out to say nothing (a report of no fault)."""
        raise NotImplementedError
