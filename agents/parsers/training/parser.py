"""TrainingLogParser: peels prefixes, hands lines to pending blocks, else reads them on their own."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers import LineParser, match_window
from agents.parsers.training.blocks import REJECT, TAKE_DONE, Block
from agents.parsers.training.checkpoints import (
    CHECKPOINT_LOADED,
    CHECKPOINT_SAVED,
    read_checkpoint,
    read_checkpoint_load,
)
from agents.parsers.training.child_failed import ChildFailed
from agents.parsers.training.classify import classify
from agents.parsers.training.common import make_event, rank_in
from agents.parsers.training.cpp import CppException, Terminate
from agents.parsers.training.cuda import KernelAsserts
from agents.parsers.training.flight_recorder import FlightRecorder
from agents.parsers.training.nccl import continues_ib_line, ib_line_may_go_on
from agents.parsers.training.prefixes import strip_prefixes
from agents.parsers.training.progress import DEFAULT_STEP_PATTERNS, Progress
from agents.parsers.training.ras import NcclRas
from agents.parsers.training.tracebacks import TB_START, Traceback
from agents.parsers.training.watchdog import Desync

_STALE_LINES = 200  # a block that saw no line of its own for this many lines is finished
_STALE_SECONDS = 10.0  # ... or for this long (the agent flushes only when the whole file goes idle)
_MAX_TIMEOUTS = 1024  # watchdog timeouts remembered to drop repeats


class TrainingLogParser(LineParser):
    """Turns training log lines into events; see the package docstring."""

    name = "training"

    def __init__(
        self,
        *,
        step_patterns: Sequence[str] = DEFAULT_STEP_PATTERNS,
        spike_factor: float = 5.0,
        path: str | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.progress = Progress(step_patterns, spike_factor, path)
        self._blocks: dict[str, Block] = {}  # pending multi-line blocks by line prefix (one per rank)
        self._ib: tuple[datetime, int | None, str, str] | None = None  # an IB error line cut in two
        self._timeouts: set[tuple[Any, ...]] = set()  # watchdog timeouts reported, to drop PyTorch's repeat
        self._line_no = 0

    @property
    def step_patterns(self) -> list[tuple[re.Pattern[str], tuple[str, ...] | None]]:
        return self.progress.step_patterns

    @property
    def last_step(self) -> int | None:
        return self.progress.last_step

    @property
    def spike_factor(self) -> float:
        return self.progress.spike_factor

    # -- public ------------------------------------------------------------------------------------

    def _flush(self, out: list[Event]) -> None:
        out += self._finish_ib()
        for _ in range(2):  # a traceback ending in ChildFailedError hands over to its table once
            for key in list(self._blocks):
                out += self._finish(key)

    def _abandon_pending(self) -> None:
        self._blocks.clear()

    # -- per line ----------------------------------------------------------------------------------

    def _feed(self, raw: str, now: datetime) -> list[Event]:
        raw = raw.rstrip("\r\n")
        self._line_no += 1
        if "\r" in raw:  # a progress bar redrawn in place: only the last drawing matters
            raw = next((seg for seg in reversed(raw.split("\r")) if seg.strip()), "")
        ts, rank, local_rank, key, body, level = strip_prefixes(match_window(raw), now)
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
        block = self._open_block(body, ts, rank, now)
        if block is not None:
            block.local_rank = local_rank
            block.add(raw)
            self._blocks[key] = block
            return events
        events += self._line(raw, body, ts, rank, local_rank, level)
        return events

    def _open_block(self, body: str, ts: datetime, rank: int | None, now: datetime) -> Block | None:
        """The multi-line block this line opens, if any (literal tests first: most lines open none)."""
        stripped = body.strip()
        at = (ts, rank, self._line_no, now)
        if stripped.startswith(TB_START):
            return Traceback(*at)
        if ChildFailed.opens(stripped):
            return ChildFailed(*at)
        if "terminate called after throwing" in stripped:
            return Terminate.open(stripped, *at)
        if stripped.startswith("Exception raised from"):
            return CppException.open(stripped, *at)
        if Desync.opens(stripped):
            desync = Desync(*at)
            desync.offer(body)
            return desync
        if ("Not all ranks joining" in stripped or "has errors" in stripped) and FlightRecorder.opens(stripped):
            report = FlightRecorder(*at)
            report.offer(body)
            return report
        if stripped.startswith("Group") and NcclRas.opens(stripped):
            return NcclRas(*at)
        assertion = KernelAsserts.match(stripped)
        if assertion is not None:
            return KernelAsserts(*at, assertion)
        return None

    def _line(
        self, raw: str, body: str, ts: datetime, rank: int | None, local_rank: int | None, level: str | None
    ) -> list[Event]:
        if ib_line_may_go_on(body):
            self._ib = (ts, rank, raw, body)
            return []
        low = body.lower()
        # Before the step lines: "Continuing training from global step 500" names the step it resumes from, not one
        # it trained.
        if (loaded := read_checkpoint_load(body, low)) is not None:
            return [make_event(ts, CHECKPOINT_LOADED, raw, "info", loaded, rank_in(body, rank), path=self.path)]
        events = self.progress.read(raw, body, low, ts, rank)
        if not events and (saved := read_checkpoint(body, low, self.progress.last_step)) is not None:
            if local_rank is not None:
                saved["local_rank"] = local_rank
            return [make_event(ts, CHECKPOINT_SAVED, raw, "info", saved, rank_in(body, rank), path=self.path)]
        events += classify(raw, body, ts, rank, local_rank, path=self.path, stepped=bool(events), level=level, low=low)
        return [e for e in events if not self._repeated_timeout(e, body)]

    def _repeated_timeout(self, event: Event, body: str) -> bool:
        """PyTorch prints a timeout again when the watchdog thread dies of it: report it once."""
        if event.kind != "watchdog_timeout":
            return False
        f = event.fields
        key = (event.rank, f.get("rank"), f.get("pg"), f.get("seq"), f.get("op"))
        if "thread terminated with exception" in body and key in self._timeouts:
            return True
        if len(self._timeouts) > _MAX_TIMEOUTS:
            self._timeouts.clear()
        self._timeouts.add(key)
        return False

    # -- block endings -----------------------------------------------------------------------------

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

    def _finish(self, key: str) -> list[Event]:
        block = self._blocks.pop(key, None)
        if block is None:
            return []
        if isinstance(block, Traceback):
            table = ChildFailed.after(block)
            if table is not None:  # torchrun's own stack: its failure table follows
                self._blocks[key] = table
                return []
        event = block.event(self.path)
        if event is None:
            return []
        if block.local_rank is not None:
            event.fields.setdefault("local_rank", block.local_rank)
        return [event]

    # -- IB completion errors cut over two lines ---------------------------------------------------

    def _merge_ib(self, raw: str, body: str) -> bool:
        assert self._ib is not None
        if not continues_ib_line(body):
            return False
        ts, rank, first_raw, first_body = self._ib
        self._ib = (ts, rank, first_raw + "\n" + raw, first_body.rstrip() + " " + body.strip())
        return True

    def _finish_ib(self) -> list[Event]:
        if self._ib is None:
            return []
        ts, rank, raw, body = self._ib
        self._ib = None
        return classify(raw, body, ts, rank, None, path=self.path)
