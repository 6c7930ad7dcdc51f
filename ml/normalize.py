"""Log line normalization: replace the variable parts of a line with placeholders so that one fault reads the same
on every node, rank and run (in the spirit of Sentry's message grouping), and hash the result into a signature.

Kept: words, exception and error names (cudaErrorIllegalAddress, ncclSystemError, ENOSPC), and the numeric codes
that carry meaning (Xid/SXid codes, IB completion status, vendor errors, errno, exit codes, signals). Replaced:
timestamps, PCI/bus ids, UUIDs, IPv4/IPv6 addresses with ports, hostnames, pids, tids, ranks, hex addresses,
directories of file paths, and every other number.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from functools import lru_cache

_Sub = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]

# Digits inside kept codes are shifted into a private-use range so the number rule cannot touch them.
_PROTECT = str.maketrans("0123456789", "".join(chr(0xE000 + i) for i in range(10)))
_UNPROTECT = str.maketrans("".join(chr(0xE000 + i) for i in range(10)), "0123456789")

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"

_TIMESTAMPS: list[_Sub] = [
    # ISO 8601 / Python logging: 2023-09-07 09:14:40,098 or 2024-01-01T00:00:00.123Z
    (
        re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"),
        "<ts>",
    ),
    # dmesg -T / ctime: Fri Aug 30 11:43:09 2024
    (re.compile(rf"\b{_DAY} {_MONTH} +\d{{1,2}} \d{{2}}:\d{{2}}:\d{{2}}(?: \d{{4}})?"), "<ts>"),
    # syslog: Aug 30 11:43:09
    (re.compile(rf"\b{_MONTH} +\d{{1,2}} \d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)?"), "<ts>"),
    # glog / absl: I0907 09:14:40.098123
    (re.compile(r"\b[IWEF]\d{3,4} \d{2}:\d{2}:\d{2}\.\d+"), "<ts>"),
    (re.compile(r"\b\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"), "<ts>"),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<ts>"),
    # dmesg monotonic: [ 1843.308145]
    (re.compile(r"\[\s*[+-]?\d+\.\d+\]"), "<ts>"),
]

_IDS: list[_Sub] = [
    (re.compile(r"\bGPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    # PCI bus ids: 0000:3b:00.0, 00000000:3B:00.0, PCI:0000:cb:00
    (re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?\b"), "<pci>"),
    # IPv6 (compressed or full, optional embedded IPv4); must contain a digit so C++ `c10d::` stays.
    (
        re.compile(
            r"(?<![0-9A-Fa-f:])(?=[\w:.]*\d)"
            r"(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}"
            r"|(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){0,6})?::(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){0,6})?"
            r"(?::?(?:\d{1,3}\.){3}\d{1,3})?)"
            r"(?:%\w+)?(?:<\d{1,5}>)?(?![\w:])"
        ),
        "<ip>",
    ),
    # IPv4 with optional port: 10.0.0.1:29500, NCCL's 172.36.143.59<44206>
    (re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5}|<\d{1,5}>)?(?![\w.])"), "<ip>"),
    # Directories of absolute paths; the file name stays (train.py, _tensor.py).
    (re.compile(r"(?<![\w/<>])(?:[A-Za-z]:)?(?:/[\w.@+~-]+)+/"), "<path>/"),
]

_PROCESS: list[_Sub] = [
    # NCCL line prefix: host:pid:tid [dev]
    (re.compile(r"^(\s*)[\w.-]+:\d+:\d+ \[\d+\]", re.M), r"\1<host>:<pid>:<tid> [<dev>]"),
    (
        re.compile(r"\b(pid|tid|ppid|thread[ _]id|process id)(\s*[=:]?\s*)'?(?:0x[0-9a-fA-F]+|\d+|<unknown>)'?", re.I),
        lambda m: f"{m.group(1)}{m.group(2)}<{m.group(1).lower()}>",
    ),
    (re.compile(r"\b(\w*rank)(\s*(?:id)?\s*[=:]?\s*)\d+\b", re.I), r"\1\2<rank>"),
    # Host names in the contexts that name them.
    (
        re.compile(r"\b(host(?:name)?|node|on host|from host|peer)(\s*[=:]\s*|\s+)(?!<)[A-Za-z][\w.-]*\d[\w.-]*", re.I),
        r"\1\2<host>",
    ),
    (re.compile(r"\b(exception from|hostname|on)\s+(?=[a-f0-9]*\d)[a-f0-9]{12}\b"), r"\1 <host>"),
]

# Codes that carry meaning: the digits stay.
_KEEP = [
    re.compile(r"\bS?Xid\b(?:\s*\([^)\n]*\))?\s*[:=]?\s*\d+", re.I),
    re.compile(r"\bstatus\s*[=:]?\s*\d+", re.I),
    re.compile(r"\bvendor err(?:or)?\s*[=:]?\s*\d+", re.I),
    re.compile(r"\bErrno\s*[=:]?\s*-?\d+", re.I),
    re.compile(r"\b(?:error code|with error)\s*[=:]?\s*-?\d+", re.I),
    re.compile(r"\bexit\s*(?:code|status)\s*[=:]?\s*-?\d+", re.I),
    re.compile(r"\bexitcode\s*[=:]?\s*-?\d+", re.I),
    re.compile(r"\bsignal\s*[=:]?\s*\d+", re.I),
    re.compile(r"\bCUDA error\s*[=:]?\s*\d+", re.I),
]

_NUMBERS: list[_Sub] = [
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # Long hex runs (addresses without 0x, container ids, hashes) that contain a digit.
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    # Digits ending an identifier: node-003, dgk713, mlx5_0, eth0 (per-machine names).
    (re.compile(r"\b([A-Za-z]{2,}[A-Za-z_]*[-_]?)\d+\b(?!::)"), r"\1<num>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?\b"), "<num>"),
]

_SPACES = re.compile(r"\s+")


@lru_cache(maxsize=64)
def _host_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    """One alternation for a job's host names, longest first so "node-10" wins over "node-1"."""
    clean = sorted({h for h in names if isinstance(h, str) and h}, key=len, reverse=True)
    if not clean:
        return re.compile(r"(?!)")  # matches nothing
    alternatives = "|".join(re.escape(h) for h in clean)
    return re.compile(rf"(?<![\w.-])(?:{alternatives})(?![\w-])")


def _apply(text: str, subs: list[_Sub]) -> str:
    """Run a list of regex substitutions in order."""
    for pattern, repl in subs:
        text = pattern.sub(repl, text)
    return text


def _protect_codes(text: str) -> str:
    """Shift the digits of meaningful codes out of the number rule's reach."""
    for pattern in _KEEP:
        text = pattern.sub(lambda m: m.group(0).translate(_PROTECT), text)
    return text


def normalize(text: str, *, hosts: Iterable[str] = ()) -> str:
    """Replace the variable parts of a log line (or block) with placeholders; known `hosts` become <host>."""
    if not isinstance(text, str):
        return ""
    out = text
    # A tuple is taken as given (callers normalizing many lines pass one, built once); anything else is cleaned.
    names = hosts if isinstance(hosts, tuple) else tuple(sorted({h for h in hosts if isinstance(h, str) and h}))
    if names:
        out = _host_pattern(names).sub("<host>", out)
    out = _apply(out, _TIMESTAMPS)
    out = _apply(out, _IDS)
    out = _apply(out, _PROCESS)
    out = _protect_codes(out)
    out = _apply(out, _NUMBERS)
    out = out.translate(_UNPROTECT)
    return _SPACES.sub(" ", out).strip()


def signature(text: str, *, hosts: Iterable[str] = ()) -> str:
    """A short stable hash of the normalized text: equal for the same fault on any node, rank or run."""
    return hashlib.blake2b(normalize(text, hosts=hosts).encode("utf-8"), digest_size=8).hexdigest()
