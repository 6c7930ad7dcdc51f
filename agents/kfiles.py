"""Reading the kernel's one-value files (sysfs, procfs) cheaply: one open and one read each, no pathlib."""

from __future__ import annotations

import os


def read_text(path: str) -> str | None:
    """The file's text, stripped; None if it is absent, unreadable or vanished meanwhile (a hot-removed device)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    except OSError:  # EIO/ENODEV from a device going away between open and read
        return None
    finally:
        os.close(fd)


def read_int(path: str) -> int | None:
    """A file holding one decimal (or 0x hex) integer; None if absent or not a number."""
    text = read_text(path)
    if not text:
        return None
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return None


def list_dir(path: str) -> list[str]:
    """Entry names, sorted; empty when the folder is absent."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
