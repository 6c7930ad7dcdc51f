"""The agent's last minutes of shipped batches, kept in memory for evidence bundles (agents/bundle.py): once shipped,
a batch leaves the spool, and a node about to be wiped takes the rest with it."""

from __future__ import annotations

import threading
import time
from collections import deque


class RecentBatches:
    """Batches (their JSON) of the last `max_age_s` seconds, at most `max_bytes` in all; the oldest go first."""

    def __init__(self, *, max_age_s: float, max_bytes: int) -> None:
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._items: deque[tuple[float, bytes]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()  # the loop adds, a bundle thread reads

    def add(self, raw: bytes, *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._items.append((now, raw))
            self._bytes += len(raw)
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._items and (self._bytes > self.max_bytes or now - self._items[0][0] > self.max_age_s):
            self._bytes -= len(self._items.popleft()[1])

    def snapshot(self, *, now: float | None = None) -> list[bytes]:
        """The batches kept, oldest first."""
        with self._lock:
            self._trim(time.monotonic() if now is None else now)
            return [raw for _, raw in self._items]
