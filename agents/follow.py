"""Following logs: files (surviving rotation and truncation), /dev/kmsg, and journald.

Each source's `poll()` returns the complete lines that arrived since the last call and never blocks.
File positions can be saved and restored, so a restarted agent goes on where it stopped instead of
missing what was written while it was down (or re-reading a whole log).
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

READ_LIMIT = 1 << 20  # per source per poll: a log that explodes must not starve the rest of the agent
MAX_LINE = 64 << 10  # a "line" longer than this is cut, so one runaway writer cannot grow the buffer
Position = dict[str, int]  # {"inode": ..., "offset": ...}


class LineSource(Protocol):
    name: str

    def poll(self) -> list[str]: ...

    def close(self) -> None: ...


def _split(buffer: bytearray, data: bytes) -> list[str]:
    buffer += data
    end = buffer.rfind(b"\n")
    if end < 0:
        if len(buffer) > MAX_LINE:
            line = bytes(buffer[:MAX_LINE]).decode(errors="replace")
            del buffer[:]
            return [line]
        return []
    chunk = bytes(buffer[:end])
    del buffer[: end + 1]
    return [line.rstrip("\r") for line in chunk.decode(errors="replace").split("\n")]


class FileTail:
    """One file, followed like `tail -F`: a renamed-away file is read to its end, then the new one."""

    def __init__(self, path: str, *, from_start: bool, position: Position | None = None) -> None:
        self.name = path
        self.path = path
        self._fd: int | None = None
        self._inode = 0
        self._offset = 0
        self._buffer = bytearray()
        self._open(from_start=from_start, position=position)

    def _open(self, *, from_start: bool, position: Position | None = None) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # not there (yet, or between a rotation's rename and create)
        info = os.fstat(fd)
        self._fd, self._inode = fd, info.st_ino
        if position and position.get("inode") == info.st_ino and position.get("offset", 0) <= info.st_size:
            self._offset = position["offset"]
        else:
            self._offset = 0 if from_start else info.st_size

    def position(self) -> Position | None:
        return {"inode": self._inode, "offset": self._offset} if self._fd is not None else None

    def _read_all(self) -> list[str]:
        assert self._fd is not None
        lines: list[str] = []
        budget = READ_LIMIT
        while budget > 0:
            data = os.pread(self._fd, min(budget, 256 << 10), self._offset)
            if not data:
                break
            self._offset += len(data)
            budget -= len(data)
            lines += _split(self._buffer, data)
        return lines

    def poll(self) -> list[str]:
        if self._fd is None:
            self._open(from_start=True)  # appeared after we started: everything in it is new
            if self._fd is None:
                return []
        lines = self._read_all()
        try:
            info = os.stat(self.path)
        except OSError:
            return lines  # rotated away and not recreated yet: keep the old descriptor
        if info.st_ino != self._inode:
            lines += self._read_all()  # the rest of the rotated file, then the new one from its start
            if self._buffer:
                lines.append(self._buffer.decode(errors="replace"))
                self._buffer.clear()
            self.close()
            self._open(from_start=True)
            if self._fd is not None:
                lines += self._read_all()
        elif info.st_size < self._offset:
            log.info("%s was truncated; reading it from the start", self.path)
            self._offset = 0
            self._buffer.clear()
            lines += self._read_all()
        return lines

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class GlobFollower:
    """Every file matching some patterns; new matches are picked up as they appear."""

    RESCAN_SECONDS = 5.0

    def __init__(self, patterns: list[str], *, from_start: bool, positions: dict[str, Position] | None = None) -> None:
        self.patterns = patterns
        self.tails: dict[str, FileTail] = {}
        self._positions = positions or {}
        self._last_scan = 0.0
        self._scan(from_start=from_start)

    def _scan(self, *, from_start: bool) -> list[str]:
        self._last_scan = time.monotonic()
        found = []
        for pattern in self.patterns:
            for path in glob.glob(pattern) if glob.has_magic(pattern) else [pattern]:
                if path not in self.tails and (os.path.exists(path) or not glob.has_magic(pattern)):
                    self.tails[path] = FileTail(path, from_start=from_start, position=self._positions.get(path))
                    found.append(path)
        return found

    def poll(self) -> dict[str, list[str]]:
        if time.monotonic() - self._last_scan > self.RESCAN_SECONDS:
            for path in self._scan(from_start=True):
                log.info("following %s", path)
        return {path: lines for path, tail in self.tails.items() if (lines := tail.poll())}

    def positions(self) -> dict[str, Position]:
        return {path: pos for path, tail in self.tails.items() if (pos := tail.position()) is not None}

    def close(self) -> None:
        for tail in self.tails.values():
            tail.close()


class KmsgDevice:
    """/dev/kmsg: one record per read; starts at the end of the ring buffer unless asked for all of it."""

    def __init__(self, path: str = "/dev/kmsg", *, from_start: bool = False) -> None:
        self.name = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)

    def poll(self) -> list[str]:
        lines = []
        while len(lines) < 10_000:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them; the next read goes on
                raise
            if not record:
                break
            lines += record.decode(errors="replace").rstrip("\n").split("\n")
        return lines

    def close(self) -> None:
        os.close(self._fd)


class Journal:
    """`journalctl -k -f` (kernel messages from journald) as a line source."""

    def __init__(self) -> None:
        self.name = "journald"
        self._process = subprocess.Popen(
            ["journalctl", "-k", "-f", "-n", "0", "-o", "short-iso", "--no-pager"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._process.stdout is not None
        self._fd = self._process.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = bytearray()

    def poll(self) -> list[str]:
        lines: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            lines += _split(self._buffer, data)
        return lines

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(5)


class SingleFile:
    """A FileTail under the LineSource interface (the kernel log given as a file)."""

    def __init__(self, path: str, *, from_start: bool, position: Position | None = None) -> None:
        self.name = path
        self.tail = FileTail(path, from_start=from_start, position=position)

    def poll(self) -> list[str]:
        return self.tail.poll()

    def position(self) -> Position | None:
        return self.tail.position()

    def close(self) -> None:
        self.tail.close()


def open_kernel_log(spec: str, *, from_start: bool, position: Position | None = None) -> LineSource:
    """`--kmsg`: "journald", a character device such as /dev/kmsg, or a file (dmesg output, kern.log)."""
    if spec == "journald":
        return Journal()
    path = Path(spec)
    if path.exists() and stat.S_ISCHR(path.stat().st_mode):
        return KmsgDevice(spec, from_start=from_start)
    return SingleFile(spec, from_start=from_start, position=position)
