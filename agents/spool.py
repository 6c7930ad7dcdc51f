"""A bounded on-disk queue of encoded batches: written before sending, removed once the service has them.

Every batch goes through the spool (a write-ahead log), so neither an unreachable service nor a killed
agent loses one: a restarted agent replays what is left, oldest first, and the service drops any batch
it already stored by its batch id. A file is written under a temporary name and renamed, so a crash
never leaves half a batch behind. When the spool is full the oldest batches are dropped and counted.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KINDS = ("metrics", "logs", "stacks", "processes", "node_metrics")
_SUFFIX = ".batch"


@dataclass(frozen=True, slots=True)
class Entry:
    path: Path
    seq: int
    counts: dict[str, int]  # items per kind, kept in the file name so dropping needs no read
    size: int

    def read(self) -> bytes:
        return self.path.read_bytes()


def _name(seq: int, counts: dict[str, int]) -> str:
    return f"{seq:016d}-" + "-".join(str(counts.get(kind, 0)) for kind in KINDS) + _SUFFIX


def _parse(path: Path) -> Entry | None:
    try:
        seq, *counts = path.name.removesuffix(_SUFFIX).split("-")
        if not 4 <= len(counts) <= len(KINDS):  # four: written before node_metrics were shipped
            return None
        return Entry(path, int(seq), dict(zip(KINDS, map(int, counts), strict=False)), path.stat().st_size)
    except (ValueError, OSError):
        return None


class Spool:
    """Oldest-first queue of batch files in one folder, bounded by bytes and by count."""

    def __init__(self, directory: Path, *, max_bytes: int, max_batches: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_batches = max_batches
        self.dropped: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)  # a write the previous agent did not finish
        self._entries: list[Entry] = sorted(
            (e for p in directory.glob(f"*{_SUFFIX}") if (e := _parse(p)) is not None), key=lambda e: e.seq
        )
        self._bytes = sum(e.size for e in self._entries)
        self._next_seq = self._entries[-1].seq + 1 if self._entries else 1
        if self._entries:
            log.info("spool: %d batches (%d bytes) left from before, replaying them first", len(self), self._bytes)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, data: bytes, counts: dict[str, int]) -> None:
        """Persist one encoded batch, dropping the oldest ones if the spool is over its bounds."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            path = self.directory / _name(seq, counts)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            self._entries.append(Entry(path, seq, counts, len(data)))
            self._bytes += len(data)
            while len(self._entries) > 1 and (self._bytes > self.max_bytes or len(self._entries) > self.max_batches):
                self._drop(self._entries[0], reason="spool full")
            self._ready.notify_all()

    def peek(self, timeout: float | None = None) -> Entry | None:
        """The oldest batch, waiting up to `timeout` seconds for one."""
        with self._lock:
            if not self._entries:
                self._ready.wait(timeout)
            return self._entries[0] if self._entries else None

    def remove(self, entry: Entry) -> None:
        """The service has this batch: forget it."""
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)
                self._bytes -= entry.size
            entry.path.unlink(missing_ok=True)

    def reject(self, entry: Entry, reason: str) -> None:
        """The service refuses this batch for good: count its items as dropped and move on."""
        with self._lock:
            if entry in self._entries:
                self._drop(entry, reason=reason)

    def wake(self) -> None:
        with self._lock:
            self._ready.notify_all()

    def _drop(self, entry: Entry, *, reason: str) -> None:
        self._entries.remove(entry)
        self._bytes -= entry.size
        entry.path.unlink(missing_ok=True)
        self.dropped.update({k: v for k, v in entry.counts.items() if v})
        self.dropped["batches"] += 1
        log.warning("spool: dropped batch %d (%s): %s", entry.seq, reason, entry.counts)
