"""Numbers as people read them: never in scientific notation, bytes in IEC units, large counts and rates with SI
prefixes. Detectors' summaries and the web UI both write numbers through these, so a value reads alike in both."""

from __future__ import annotations

import math

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_IEC = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_MAX_DECIMALS = 9


def significant(value: float, digits: int = 3) -> str:
    """`digits` significant digits in fixed notation: 0.000123, 1.5, 486, 123457; trailing zeros dropped."""
    if not math.isfinite(value):
        return "?"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = min(_MAX_DECIMALS, max(0, digits - 1 - magnitude))
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def si(value: float, unit: str = "", *, digits: int = 3, sep: str = " ") -> str:
    """1.5 k, 70.4 GB/s, 12 W: an SI prefix from a thousand up; `unit` after it (none: just the prefix)."""
    if not math.isfinite(value):
        return "?"
    for size, prefix in _SI:
        if abs(value) >= size:
            return f"{significant(value / size, digits)}{sep}{prefix}{unit}".rstrip()
    return f"{significant(value, digits)}{sep}{unit}".rstrip() if unit else significant(value, digits)


def iec(value: float, unit: str = "B", *, digits: int = 3) -> str:
    """Bytes in powers of 1024: 512 B, 1.5 KiB, 65.5 GiB; `unit` "B/s" for rates."""
    if not math.isfinite(value):
        return "?"
    suffix = unit.removeprefix("B")
    for size, name in _IEC:
        if abs(value) >= size:
            return f"{significant(value / size, digits)} {name}{suffix}"
    return f"{significant(value, digits)} {unit}"


def quantity(value: float, unit: str = "", *, digits: int = 3) -> str:
    """A value with its unit, in the form the unit calls for: bytes in IEC, percent as is, others with SI prefixes."""
    if unit in ("B", "B/s"):
        return iec(value, unit, digits=digits)
    if unit == "%":
        return f"{significant(value, digits)}%"
    if unit in ("ratio", "state"):
        return significant(value, digits)
    if unit == "°C":
        return f"{significant(value, digits)} °C"
    return si(value, unit, digits=digits)
