"""GPU samples taken since the last batch: held for the next ship tick, and journaled so none is lost.

The agent samples GPU counters every sample interval but ships every ship interval, so samples wait in
memory for a few seconds. Each sample round is also appended to a journal file beside the spool (one
JSON line per round), so an agent killed between ship ticks loses nothing it sampled: the next start
turns a left-over journal into a batch. A journal is named after the id of the batch its samples will
go out in, chosen before the first sample: if the agent dies after spooling that batch but before
removing the journal, the recovered batch has the same id and the service stores it once.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import IO, Any

import orjson

log = logging.getLogger(__name__)

_PREFIX = "samples-"
_SUFFIX = ".jsonl"


class SampleBuffer:
    """The metric items of the batch being gathered, in memory and (with a folder) on disk."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.batch_id = str(uuid.uuid4())
        self.metrics: list[dict[str, Any]] = []
        self._journal: IO[bytes] | None = None

    def __len__(self) -> int:
        return len(self.metrics)

    def add(self, metrics: list[dict[str, Any]]) -> None:
        """Keep one sample round (every GPU at one instant); journaled before it counts as taken."""
        if not metrics:
            return
        if self.directory is not None:
            if self._journal is None:
                self._journal = self._path(self.batch_id).open("ab", buffering=0)
            # One write per round: a kill leaves whole lines (a torn last line is skipped on recovery).
            self._journal.write(orjson.dumps(metrics) + b"\n")
        self.metrics += metrics

    def shipped(self) -> None:
        """The batch with these samples is in the spool: forget them and start the next batch."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
            self._path(self.batch_id).unlink(missing_ok=True)
        self.batch_id = str(uuid.uuid4())
        self.metrics = []

    def close(self) -> None:
        """Stop journaling without forgetting: what is left is recovered by the next start."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _path(self, batch_id: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{_PREFIX}{batch_id}{_SUFFIX}"


def left_over(directory: Path) -> list[tuple[Path, str, list[dict[str, Any]]]]:
    """Journals a previous agent left behind: (path, batch id, metric items), oldest first."""
    found = []
    for path in sorted(directory.glob(f"{_PREFIX}*{_SUFFIX}"), key=_mtime):
        batch_id = path.name.removeprefix(_PREFIX).removesuffix(_SUFFIX)
        try:
            batch_id = str(uuid.UUID(batch_id))
        except ValueError:  # not a name this agent wrote: ship the samples under a new id
            batch_id = str(uuid.uuid4())
        found.append((path, batch_id, _read(path)))
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _read(path: Path) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        log.warning("cannot read the sample journal %s: %s", path, exc)
        return metrics
    for line in lines:
        try:
            metrics += orjson.loads(line)
        except orjson.JSONDecodeError:
            log.warning("sample journal %s: skipping a torn line (%d bytes)", path.name, len(line))
    return metrics
