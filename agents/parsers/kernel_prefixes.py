"""The prefixes a kernel log line arrives with, read and removed: raw /dev/kmsg records, `dmesg` ([sec.usec] since
boot, -T wall clock, -H/--reltime deltas, -x facility:level), journald `short` (with or without the host name, in
English or another locale's month names) and `short-iso`, syslog files."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

from agents.parsers import MONTHS, frac_us, infer_year, iso_datetime

# -- prefixes --------------------------------------------------------------------------------------

# /dev/kmsg: "prio,seq,usec,flags[,more];message"; its continuation lines (" KEY=value") carry
# the record's dictionary (SUBSYSTEM=, DEVICE=), which says nothing we need.
KMSG = re.compile(r"(\d{1,4}),(\d+),(\d+),[^;]{0,32};")
KMSG_DICT = re.compile(r"\s+[A-Z_][A-Z0-9_]*=")
# dmesg -x: "kern  :warn  : "
_DMESG_X = re.compile(r"[a-z]{2,8}\s*:[a-z]{3,6}\s*: ")
# dmesg: "[ 1234.567890] "
_DMESG_MONO = re.compile(r"\[\s*(\d{1,10})\.(\d{1,9})\]\s?")
# dmesg -T: "[Sat Nov 22 10:00:00 2026] "
_DMESG_T = re.compile(r"\[[A-Z][a-z]{2} ([A-Z][a-z]{2})\s+(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]\s?")
# dmesg -H / --reltime: "[Nov22 10:00]", "[  +0.000316]", "[<    0.000316>]": no usable wall time.
_DMESG_REL = re.compile(r"(?:\[\s*\+[\d.]+\]|\[<[\s\d.+]+>\]|\[[A-Z][a-z]{2}\s?\d{1,2} \d\d:\d\d\])\s?")
# journald/syslog short: "Nov 22 10:00:00[.123456] host kernel: ". The host is absent from `journalctl
# --no-hostname` ("Mar 21 21:42:01 kernel: "), so it is optional and never ends in ':' (else "kernel:" would be
# taken for it); the month is the locale's ("jan.", "Mär", "11月"), checked against _MONTH_WORDS.
_SYSLOG = re.compile(
    r"(\d{1,2}[月월]|[^\W\d_]{3,5}\.?)\s+(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))? "
    r"(?:[^\s:]\S*(?<!:) )?[\w.@/-]{1,64}(?:\[\d+\])?: "
)
# Month abbreviations of the locales journald and rsyslog print (glibc's %b), lower-cased, without a trailing
# dot; English is agents.parsers.MONTHS. Where two locales share a word they mean the same month.
_MONTH_WORDS: dict[str, int] = {
    **{m.lower(): n for m, n in MONTHS.items()},
    # German, French, Spanish, Italian, Portuguese, Dutch, Scandinavian, Polish
    "jän": 1, "janv": 1, "ene": 1, "gen": 1, "sty": 1,
    "fév": 2, "févr": 2, "fev": 2, "lut": 2,
    "mär": 3, "mrz": 3, "mars": 3, "mrt": 3,
    "avr": 4, "abr": 4, "kwi": 4,
    "mai": 5, "mei": 5, "mag": 5, "maj": 5,
    "juin": 6, "giu": 6, "cze": 6,
    "juil": 7, "lug": 7, "lip": 7,
    "août": 8, "ago": 8, "sie": 8,
    "sept": 9, "set": 9, "wrz": 9,
    "okt": 10, "ott": 10, "out": 10, "paź": 10,
    "lis": 11,
    "déc": 12, "dez": 12, "dic": 12, "des": 12, "gru": 12,
    # Russian
    "янв": 1, "фев": 2, "мар": 3, "апр": 4, "мая": 5, "май": 5, "июн": 6, "июл": 7, "авг": 8, "сен": 9,
    "окт": 10, "ноя": 11, "дек": 12,
}  # fmt: skip
# journald short-iso / rsyslog RFC 3339: "2026-11-22T10:00:00[.123][+0000|+00:00|Z] host kernel: " (the host
# optional, as in short)
_ISO = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)? "
    r"(?:[^\s:]\S*(?<!:) )?[\w.@/-]{1,64}(?:\[\d+\])?: "
)
_BARE_KERNEL = re.compile(r"kernel: ")
KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def strip_prefix(text: str, now: datetime, since_boot: Callable[[float], datetime]) -> tuple[datetime, str]:
    """The line's time and its message: a kmsg-free line's syslog, journald or dmesg prefix read and removed;
    `since_boot` turns dmesg's seconds since boot into a time."""
    wall: datetime | None = None  # a syslog/journald wall-clock stamp, which beats dmesg's
    m = _ISO.match(text)
    if m:
        wall = iso_datetime(m)
        text = text[m.end() :]
    else:
        m = _SYSLOG.match(text)
        if m and _month(m.group(1)) is not None:
            wall = _syslog_ts(m, now)
            text = text[m.end() :]
        else:
            m = _BARE_KERNEL.match(text) or _DMESG_X.match(text)
            if m:
                text = text[m.end() :]
    # dmesg stamps, alone or inside a syslog line (kern.log keeps them); the outer wall time wins.
    m = _DMESG_MONO.match(text)
    if m:
        if wall is None:
            wall = since_boot(int(m.group(1)) + frac_us(m.group(2)) / 1_000_000)
        return wall or now, text[m.end() :].strip()
    m = _DMESG_T.match(text)
    if m:
        return wall or _dmesg_t_ts(m) or now, text[m.end() :].strip()
    m = _DMESG_REL.match(text)
    if m:
        return wall or now, text[m.end() :].strip()
    return wall or now, text


def _month(word: str) -> int | None:
    """A syslog stamp's month: "Nov", "jan.", "Mär", "11月"; None for a word that is no month."""
    if word[-1] in "月월":
        n = int(word[:-1])
        return n if 1 <= n <= 12 else None
    return _MONTH_WORDS.get(word.rstrip(".").lower())


def _syslog_ts(m: re.Match[str], now: datetime) -> datetime | None:
    mon, d, h, mi, s, frac = m.groups()
    month = _month(mon)
    if month is None:
        return None
    try:
        return datetime(
            infer_year(month, int(d), now), month, int(d), int(h), int(mi), int(s), frac_us(frac), tzinfo=UTC
        )
    except ValueError:
        return None


def _dmesg_t_ts(m: re.Match[str]) -> datetime | None:
    mon, d, h, mi, s, y = m.groups()
    month = MONTHS.get(mon)
    if month is None:
        return None
    try:
        return datetime(int(y), month, int(d), int(h), int(mi), int(s), tzinfo=UTC)
    except ValueError:
        return None
