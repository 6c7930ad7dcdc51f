"""Plot geometry for the web UI: window summaries in, SVG coordinates out (pure: no database, no templates).

Detectors summarize a metric per time window (a trimmed mean, a median step time), so a window is drawn as
a flat step from its start to its end rather than as a point: the picture shows exactly what was compared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ml.quantities import si, significant

# What a metric is measured in, for the axis label (DCGM field units; counters arrive as per-second rates).
UNITS: dict[str, str] = {
    "power_usage": "W",
    "power_limit": "W",
    "gpu_util": "%",
    "mem_copy_util": "%",
    "sm_clock": "MHz",
    "mem_clock": "MHz",
    "gpu_temp": "°C",
    "memory_temp": "°C",
    "tensor_active": "ratio",
    "sm_active": "ratio",
    "sm_occupancy": "ratio",
    "gr_engine_active": "ratio",
    "dram_active": "ratio",
    "nvlink_tx_bytes": "B/s",
    "nvlink_rx_bytes": "B/s",
    "pcie_tx_bytes": "B/s",
    "pcie_rx_bytes": "B/s",
    "nvlink_bandwidth_total": "per s",
    "step_time": "ms",
    "step_s": "s",
    "cpu": "%",
    # Machine-level metrics (ml/node_metrics.py); counters are drawn as increases per second.
    "port_state": "state",
    "port_rate_gbps": "Gb/s",
    "port_xmit_wait": "ticks/s",
    "pause_tx_frames": "frames/s",
    "pause_rx_frames": "frames/s",
    "link_downed": "per s",
    "symbol_error": "per s",
    "psi_mem_some_avg10": "%",
    "psi_mem_full_avg10": "%",
    "mem_available_mib": "MiB",
}


@dataclass(frozen=True, slots=True)
class Window:
    """One window's summary: the suspect's value and, where known, its peers' median and p10-p90 band."""

    start: datetime
    end: datetime
    value: float
    median: float | None = None
    p10: float | None = None
    p90: float | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    pos: float  # x for time ticks, y for value ticks
    label: str


@dataclass(frozen=True, slots=True)
class Plot:
    width: int
    height: int
    left: float  # the drawing area inside the axes
    top: float
    right: float
    bottom: float
    suspect: str  # SVG path data
    median: str | None  # SVG path data
    band: str | None  # SVG polygon points
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    title: str
    unit: str
    windows: list[Window]  # chronological, for the table of numbers beside the picture


def unit_of(metric: str) -> str:
    return UNITS.get(metric, "")


def parse_time(value: Any) -> datetime | None:
    """An ISO timestamp from evidence JSON, as an aware datetime; None when it is not one."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def windows_from(
    rows: Iterable[Mapping[str, Any]],
    *,
    value: str = "value",
    median: str = "peer_median",
    p10: str = "peer_p10",
    p90: str = "peer_p90",
    baseline: float | None = None,
) -> list[Window]:
    """Windows from evidence rows ({start, end, value, peer_median, peer_p10, peer_p90}), chronological;
    rows without a readable start, end or value are skipped. `baseline` stands in for a missing median."""
    out = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        start, end, v = parse_time(row.get("start")), parse_time(row.get("end")), _number(row.get(value))
        if start is None or end is None or v is None or end <= start:
            continue
        m = _number(row.get(median))
        out.append(
            Window(start, end, v, m if m is not None else baseline, _number(row.get(p10)), _number(row.get(p90)))
        )
    return sorted(out, key=lambda w: w.start)


def nice_step(span: float, target: int = 4) -> float:
    """A 1, 2 or 5 times a power of ten step that cuts `span` into about `target` parts."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    power = 10 ** math.floor(math.log10(span / max(1, target)))
    candidates = [factor * power for factor in (1, 2, 5, 10)]
    return min(candidates, key=lambda step: (abs(span / step - target), -step))


def format_value(value: float) -> str:
    """Short axis labels: 486, 0.32, 15k, 2.3G; never in scientific notation."""
    return si(value, sep="") if abs(value) >= 1e4 else significant(value, 4 if abs(value) >= 1 else 3)


def _domain(windows: Sequence[Window]) -> tuple[float, float, float]:
    """The value axis: every value, median and band edge inside, padded, snapped to a nice step."""
    values = [w.value for w in windows]
    values += [v for w in windows for v in (w.median, w.p10, w.p90) if v is not None]
    low, high = min(values), max(values)
    span = high - low
    pad = span * 0.1 if span > 0 else max(abs(high) * 0.1, 1.0)
    low, high = low - pad, high + pad
    if min(values) >= 0 > low:
        low = 0.0  # a non-negative metric keeps a non-negative axis
    step = nice_step(high - low)
    return math.floor(low / step) * step, math.ceil(high / step) * step, step


def _steps(points: Sequence[tuple[float, float, float]]) -> str:
    """SVG path of flat steps (x0, x1, y), joined vertically where windows touch."""
    parts: list[str] = []
    last_x: float | None = None
    for x0, x1, y in points:
        if last_x is not None and abs(x0 - last_x) < 0.5:
            parts.append(f"V{y:.1f}H{x1:.1f}")
        else:
            parts.append(f"M{x0:.1f},{y:.1f}H{x1:.1f}")
        last_x = x1
    return "".join(parts)


def window_plot(
    windows: Sequence[Window], *, title: str, unit: str = "", width: int = 520, height: int = 190
) -> Plot | None:
    """The suspect's steps over its peers' band and median, with axes; None without a single window."""
    ws = sorted(windows, key=lambda w: w.start)
    if not ws:
        return None
    left, top, right, bottom = 56.0, 24.0, width - 30.0, height - 26.0
    t0, t1 = ws[0].start.timestamp(), max(w.end for w in ws).timestamp()
    lo, hi, step = _domain(ws)

    def x(t: datetime) -> float:
        return left + (t.timestamp() - t0) / (t1 - t0) * (right - left)

    def y(v: float) -> float:
        return bottom - (v - lo) / (hi - lo) * (bottom - top)

    suspect = _steps([(x(w.start), x(w.end), y(w.value)) for w in ws])
    with_median = [w for w in ws if w.median is not None]
    median = _steps([(x(w.start), x(w.end), y(w.median)) for w in with_median]) if with_median else None  # type: ignore[arg-type]
    banded = [w for w in ws if w.p10 is not None and w.p90 is not None]
    band = None
    if banded:
        upper = [(px, y(w.p90)) for w in banded for px in (x(w.start), x(w.end))]  # type: ignore[arg-type]
        lower = [(px, y(w.p10)) for w in reversed(banded) for px in (x(w.end), x(w.start))]  # type: ignore[arg-type]
        band = " ".join(f"{px:.1f},{py:.1f}" for px, py in upper + lower)

    y_ticks = []
    count = round((hi - lo) / step)
    for i in range(count + 1):
        v = lo + i * step
        y_ticks.append(Tick(round(y(v), 1), format_value(v)))

    boundaries = sorted({w.start for w in ws} | {w.end for w in ws})
    room = max(2, int((right - left) // 70))  # a time label needs about 70 px
    every = max(1, math.ceil(len(boundaries) / room))
    picked = boundaries[::every]
    if boundaries[-1] not in picked and (x(boundaries[-1]) - x(picked[-1])) >= 60:
        picked.append(boundaries[-1])
    x_ticks = [Tick(round(x(t), 1), t.astimezone(UTC).strftime("%H:%M:%S")) for t in picked]
    return Plot(width, height, left, top, right, bottom, suspect, median, band, x_ticks, y_ticks, title, unit, ws)


@dataclass(frozen=True, slots=True)
class RatioPlot:
    """Ratios (0 to 1) over time as lines: the cumulative one and the sliding-window one."""

    width: int
    height: int
    left: float
    top: float
    right: float
    bottom: float
    cumulative: str  # SVG path data
    window: str  # SVG path data
    x_ticks: list[Tick]
    y_ticks: list[Tick]


def _line(points: Sequence[tuple[float, float | None]]) -> str:
    """SVG path through the points, broken where a value is missing."""
    parts: list[str] = []
    pen_down = False
    for px, py in points:
        if py is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{px:.1f},{py:.1f}")
        pen_down = True
    return "".join(parts)


def ratio_plot(
    points: Sequence[tuple[datetime, float | None, float | None]], *, width: int = 520, height: int = 190
) -> RatioPlot | None:
    """(time, cumulative ratio, window ratio) points on a 0-100% axis; None with fewer than two points or no value."""
    if len(points) < 2 or all(c is None and w is None for _, c, w in points):
        return None
    left, top, right, bottom = 44.0, 16.0, width - 20.0, height - 26.0
    t0, t1 = points[0][0].timestamp(), points[-1][0].timestamp()
    span = max(t1 - t0, 1e-9)

    def x(t: datetime) -> float:
        return left + (t.timestamp() - t0) / span * (right - left)

    def y(v: float | None) -> float | None:
        return None if v is None else bottom - max(0.0, min(1.0, v)) * (bottom - top)

    y_ticks = [Tick(round(bottom - f * (bottom - top), 1), f"{f:.0%}") for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    room = max(2, int((right - left) // 70))
    every = max(1, math.ceil(len(points) / room))
    picked = [p[0] for p in points[::every]]
    label = "%H:%M" if t1 - t0 >= 600 else "%H:%M:%S"
    x_ticks = [Tick(round(x(t), 1), t.astimezone(UTC).strftime(label)) for t in picked]
    return RatioPlot(
        width,
        height,
        left,
        top,
        right,
        bottom,
        cumulative=_line([(x(t), y(c)) for t, c, _ in points]),
        window=_line([(x(t), y(w)) for t, _, w in points]),
        x_ticks=x_ticks,
        y_ticks=y_ticks,
    )
