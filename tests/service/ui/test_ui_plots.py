"""Plot geometry (service.ui.plots): window summaries in, SVG coordinates out, checked number by number."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta

import pytest

from ml import peers
from service.ui import plots
from tests.simdata import SimRun

T0 = datetime(2026, 11, 22, 21, 32, 0, tzinfo=UTC)


def window(i: int, value: float, median: float | None = None, p10: float | None = None, p90: float | None = None):
    start = T0 + timedelta(seconds=30 * i)
    return plots.Window(start, start + timedelta(seconds=30), value, median, p10, p90)


def steps(d: str) -> list[tuple[float, float, float]]:
    """(x0, x1, y) of each flat step in a path of M x,y H x / V y H x commands."""
    out: list[tuple[float, float, float]] = []
    x = y = 0.0
    for cmd, args in re.findall(r"([MHV])([-\d.,]+)", d):
        if cmd == "M":
            x, y = (float(v) for v in args.split(","))
        elif cmd == "V":
            y = float(args)
        else:
            out.append((x, float(args), y))
            x = float(args)
    return out


def points(polygon: str) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in (p.split(",") for p in polygon.split())]


def test_each_window_is_a_step_from_its_start_to_its_end_with_higher_values_higher_up() -> None:
    plot = plots.window_plot([window(0, 10), window(1, 20), window(2, 15)], title="power_usage", unit="W")
    assert plot is not None
    s = steps(plot.suspect)
    assert len(s) == 3
    assert s[0][0] == plot.left and s[-1][1] == pytest.approx(plot.right, abs=0.1)
    # Contiguous windows share their boundaries and split the width evenly.
    assert s[0][1] == s[1][0] and s[1][1] == s[2][0]
    width = (plot.right - plot.left) / 3
    assert s[0][1] - s[0][0] == pytest.approx(width, abs=0.1)
    # SVG y grows downwards: 20 is above 15, which is above 10; all inside the drawing area.
    y10, y20, y15 = (y for _, _, y in s)
    assert y20 < y15 < y10
    assert all(plot.top <= y <= plot.bottom for y in (y10, y20, y15))
    assert plot.median is None and plot.band is None  # nothing to compare with: no dashed line, no band


def test_the_band_spans_p10_to_p90_around_the_dashed_median() -> None:
    ws = [window(0, 365, 486, 472, 494), window(1, 363, 481, 467, 497)]
    plot = plots.window_plot(ws, title="power_usage", unit="W")
    assert plot is not None and plot.band is not None and plot.median is not None
    band = points(plot.band)
    assert len(band) == 8  # upper edge left to right (2 per window), lower edge back
    upper, lower = band[:4], band[4:]
    assert [x for x, _ in upper] == sorted(x for x, _ in upper)
    assert [x for x, _ in lower] == sorted((x for x, _ in lower), reverse=True)
    medians = steps(plot.median)
    suspect = steps(plot.suspect)
    for (x0, x1, ym), (_, _, ys), i in zip(medians, suspect, range(2), strict=True):
        top = upper[2 * i][1]  # p90
        bottom = lower[len(lower) - 1 - 2 * i][1]  # p10, same window
        assert top < ym < bottom  # the median inside the band
        assert ys > bottom  # the suspect well below its peers
        assert upper[2 * i][0] == x0 and upper[2 * i + 1][0] == x1


def test_the_value_axis_holds_everything_with_nice_round_ticks() -> None:
    plot = plots.window_plot([window(0, 0.47, 0.30, 0.29, 0.31), window(1, 0.50, 0.32, 0.31, 0.33)], title="t")
    assert plot is not None
    values = [float(t.label) for t in plot.y_ticks]
    assert values == sorted(values) and values[0] <= 0.29 and values[-1] >= 0.50
    steps_between = {round(b - a, 6) for a, b in itertools.pairwise(values)}
    assert len(steps_between) == 1 and steps_between.pop() in (0.05, 0.1, 0.2)
    ys = [t.pos for t in plot.y_ticks]
    assert ys == sorted(ys, reverse=True)  # larger values higher up
    assert ys[0] == pytest.approx(plot.bottom, abs=0.1) and ys[-1] == pytest.approx(plot.top, abs=0.1)


def test_time_ticks_are_window_boundaries_in_utc_and_never_crowd() -> None:
    plot = plots.window_plot([window(i, float(i)) for i in range(4)], title="x", width=520)
    assert plot is not None
    assert [t.label for t in plot.x_ticks] == ["21:32:00", "21:32:30", "21:33:00", "21:33:30", "21:34:00"]
    many = plots.window_plot([window(i, float(i)) for i in range(40)], title="x", width=520)
    assert many is not None
    xs = [t.pos for t in many.x_ticks]
    assert len(xs) <= 8 and min(b - a for a, b in itertools.pairwise(xs)) >= 60


def test_a_flat_series_and_a_single_window_still_draw() -> None:
    flat = plots.window_plot([window(0, 1980, 1980, 1980, 1980), window(1, 1980, 1980, 1980, 1980)], title="sm_clock")
    assert flat is not None
    assert all(plot_y == steps(flat.suspect)[0][2] for _, _, plot_y in steps(flat.suspect))
    assert flat.top < steps(flat.suspect)[0][2] < flat.bottom
    one = plots.window_plot([window(0, 5.0)], title="x")
    assert one is not None and len(steps(one.suspect)) == 1
    assert plots.window_plot([], title="x") is None


def test_gaps_between_windows_break_the_line() -> None:
    plot = plots.window_plot([window(0, 1), window(2, 2)], title="x")
    assert plot is not None
    assert plot.suspect.count("M") == 2


def test_windows_are_read_from_evidence_rows_skipping_the_unreadable() -> None:
    rows = [
        {"start": "2026-11-22T21:33:00+00:00", "end": "2026-11-22T21:33:30+00:00", "value": 2, "peer_median": 1},
        {"start": "2026-11-22T21:32:30+00:00", "end": "2026-11-22T21:33:00+00:00", "value": 3, "peer_p10": 0.5},
        {"start": "not a time", "end": "2026-11-22T21:33:30+00:00", "value": 2},
        {"start": "2026-11-22T21:33:00+00:00", "end": "2026-11-22T21:33:30+00:00", "value": "NaN"},
        {"start": "2026-11-22T21:33:30+00:00", "end": "2026-11-22T21:33:00+00:00", "value": 1},
        "garbage",
    ]
    ws = plots.windows_from(rows)  # type: ignore[arg-type]
    assert [(w.start.second, w.value, w.median, w.p10) for w in ws] == [(30, 3.0, None, 0.5), (0, 2.0, 1.0, None)]
    steps_rows = [{"start": "2026-11-22T21:32:12+00:00", "end": "2026-11-22T21:32:22+00:00", "step_s": 1.34}]
    assert plots.windows_from(steps_rows, value="step_s", baseline=1.01)[0].median == 1.01


@pytest.mark.parametrize(
    ("span", "step"), [(1.0, 0.2), (0.23, 0.05), (130.0, 50.0), (999.0, 200.0), (4.0, 1.0), (0.0, 1.0)]
)
def test_nice_steps(span: float, step: float) -> None:
    assert plots.nice_step(span) == pytest.approx(step)


@pytest.mark.parametrize(
    ("value", "label"),
    [(486.0, "486"), (0.3236, "0.324"), (1980.0, "1980"), (2.5e9, "2.5G"), (15000.0, "15k"), (0, "0")],
)
def test_value_labels_are_short(value: float, label: str) -> None:
    assert plots.format_value(value) == label


def test_the_peers_detectors_own_evidence_plots() -> None:
    """The contract with ml.peers: what the detector writes for a real straggler is what the plot reads."""
    run = SimRun("straggler", seed=1, nodes=4, gpus=8).run(300)
    _, _, injected = run.fault()
    t = injected + 150
    findings = peers.detect(run.job, run.metrics(until=t, lookback=300), now=run.at(t))
    assert findings
    metric = findings[0].evidence["metrics"][0]
    ws = plots.windows_from(metric["windows"])
    assert len(ws) == len(metric["windows"]) >= 4
    assert all(w.median is not None and w.p10 is not None and w.p90 is not None for w in ws)
    plot = plots.window_plot(ws, title=metric["metric"], unit=plots.unit_of(metric["metric"]))
    assert plot is not None and plot.band and plot.median
    # The metric that tells why it lags leads (issue 40): the throttled SM clock.
    assert plot.unit == "MHz" and metric["metric"] == "sm_clock"
    assert len(steps(plot.suspect)) == len(ws)


def test_ratio_plot_draws_both_lines_on_a_percent_axis_and_breaks_at_gaps() -> None:
    from service.ui.plots import ratio_plot

    t0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    points = [(t0 + timedelta(minutes=i), c, w) for i, (c, w) in enumerate([(1.0, None), (0.5, 0.5), (0.0, 0.25)])]
    g = ratio_plot(points, width=220, height=126)
    assert g is not None
    # x from 44 to 200, y from 100 (0%) to 16 (100%).
    assert g.cumulative == "M44.0,16.0L122.0,58.0L200.0,100.0"
    assert g.window == "M122.0,58.0L200.0,79.0"
    assert [t.label for t in g.y_ticks] == ["0%", "25%", "50%", "75%", "100%"]
    assert ratio_plot(points[:1]) is None and ratio_plot([(t0, None, None), (t0, None, None)]) is None
