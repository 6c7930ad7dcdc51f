"""Launcher and logger prefixes of a training log line: where the rank and the time come from.

torchrun `[rank3]:` / `[default3]:` (and the `[pid]` before them), srun `3: `, Open MPI's --tag-output
`[1,3]<stdout>:`, pdsh/clush `host: `, a launcher's task tag before torchrun's (`B-nemo-ft3/0 `),
`[INFO]` levels, ISO timestamps (with mpirun's `: ` after them), bare wall clocks `18:11:06.680 `,
glog/c10 `E0213 12:07:20.086000 870572 file.py:869]` and older c10 `[E file.cc:821]`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from agents.parsers import frac_us, infer_year, iso_datetime

_P_ISO = re.compile(
    r" {0,4}\[?(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?\s?(Z|[+-]\d\d:?\d\d)?\]?:? ?"
)
_P_LEVEL = re.compile(r"\[(INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\] (?=\d{4}-)")
_P_PID = re.compile(r"\[\d{1,10}\] (?=\[(?:rank|default)\d)")
_P_TORCHRUN = re.compile(r"\[(rank|default|[A-Za-z_]{1,32}?)(\d{1,6})\]: ?")
_P_SRUN = re.compile(r" {0,5}(\d{1,6}): ")
# Open MPI --tag-output: "[jobid,rank]<stdout>:"
_P_MPI_TAG = re.compile(r"\[(\d{1,6}),(\d{1,6})\]<(?:stdout|stderr)>: ?")
# pdsh / clush / `srun -l` with names: "10.0.87.143: ", "node-12: ", "gpu01.cluster: " (a name with a digit,
# a dash or a dot and no capitals: not an exception's "RuntimeError: ", nor a logger's "torch.distributed: ")
_P_HOST = re.compile(r"(?:(?:\d{1,3}\.){3}\d{1,3}|[a-z][a-z0-9_]*(?=[a-z0-9_.-]*\d)(?:[-.][a-z0-9_]+)+): ")
# A wall clock without a date: "18:11:06.680 " (no usable time: the line keeps the time it was read)
# A launcher's task tag before torchrun's: NeMo-Run's "B-nemo-ft3/0 [default1]:"
_P_TASK = re.compile(r"[\w.-]{1,64}/\d{1,6} (?=\[(?:rank|default|[A-Za-z_]{1,32}?)\d{1,6}\]:)")
_P_CLOCK = re.compile(r"\d\d:\d\d:\d\d(?:[.,]\d{1,9})? ")
# glog: "E0213 12:07:20.086000 870572 torch/.../api.py:869] "; c10: "[E321 02:07:08.408271257 file.cc:607] "
_P_GLOG = re.compile(r"\[?([IWEF])(\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})(?: +\d+)? [^\s\]]{1,200}:\d+\] ?")
_P_C10 = re.compile(r"\[([IWEF]) [^\s\]]{1,200}:\d+\] ?")  # older c10: "[E ProcessGroupNCCL.cpp:821] "

_MAX_PREFIXES = 6  # prefixes peeled from one line at most


# (time, rank, local rank, key, body, level): the line's own time, else when it was read; the global
# rank ("[rank3]:", srun's "3: "); torchrun's local rank ("[default3]:"); the rank prefixes as written
# (a multi-line block collects lines of the same key only); the message; its log level ("E", "ERROR").
# A plain tuple, not a NamedTuple: built for every line, and a NamedTuple costs six times as much.
Prefixes = tuple[datetime, int | None, int | None, str, str, str | None]


def strip_prefixes(text: str, now: datetime) -> Prefixes:
    """Peel launcher and logger prefixes off `text`, in whatever order they were stacked."""
    ts: datetime | None = None
    rank: int | None = None
    local_rank: int | None = None
    level: str | None = None
    key = ""
    hosted = False  # the key so far is host prefixes only
    body = text
    for _ in range(_MAX_PREFIXES):
        m = _P_PID.match(body)
        if m:
            body = body[m.end() :]
            continue
        m = _P_TORCHRUN.match(body)
        if m:
            # torchrun's own tee prefix is "[{role}{local_rank}]:" (e.g. "[default3]:"); "[rank3]:"
            # is the global rank (PyTorch's rank-prefixed output and log_line_prefix_template).
            if m.group(1) == "rank":
                rank = int(m.group(2))
            else:
                local_rank = int(m.group(2))
            key += m.group(0).strip()
            body = body[m.end() :]
            continue
        if body.startswith("[") and "]<std" in body[:20]:
            m = _P_MPI_TAG.match(body)
            if m:
                rank = int(m.group(2))
                key += m.group(0).strip()
                body = body[m.end() :]
                continue
        if (not key or hosted) and body and body[0] in "0123456789abcdefghijklmnopqrstuvwxyz":
            m = _P_HOST.match(body)
            if m:  # pdsh over ssh prefixes twice: "10.0.0.1: 10.0.0.1: "
                key, hosted = key + m.group(0).strip(), True
                body = body[m.end() :]
                continue
        if not key and "/" in body[:66]:
            m = _P_TASK.match(body)
            if m:
                key = m.group(0).strip()
                body = body[m.end() :]
                continue
        if ts is None and body[2:3] == ":":
            m = _P_CLOCK.match(body)
            if m:
                body = body[m.end() :]
                continue
        if not key:
            m = _P_SRUN.match(body)
            if m:
                rank = int(m.group(1))
                key = m.group(1) + ":"
                body = body[m.end() :]
                continue
        m = _P_LEVEL.match(body)
        if m:
            level = m.group(1)
            body = body[m.end() :]
            continue
        # First-character tests: most lines start with neither a stamp nor a glog header.
        if ts is None and body and body[0] in " [0123456789":
            m = _P_ISO.match(body)
            if m:
                ts = iso_datetime(m)
                body = body[m.end() :]
                continue
        if body and body[0] in "[IWEF":
            m = _P_GLOG.match(body)
            if m:
                ts = ts or _glog_datetime(m, now)
                level = level or m.group(1)
                body = body[m.end() :]
                continue
            m = _P_C10.match(body)
            if m:
                level = level or m.group(1)
                body = body[m.end() :]
                continue
        break
    return ts or now, rank, local_rank, key, body, level


def _glog_datetime(m: re.Match[str], now: datetime) -> datetime | None:
    """glog stamps have no year: infer it from `now`."""
    _, mo, d, h, mi, s, frac = m.groups()
    month, day = int(mo), int(d)
    if not 1 <= month <= 12:
        return None
    try:
        return datetime(infer_year(month, day, now), month, day, int(h), int(mi), int(s), frac_us(frac), tzinfo=UTC)
    except ValueError:
        return None
