"""Numbers as people read them: no scientific notation at any magnitude, bytes in IEC, rates with SI prefixes."""

from __future__ import annotations

import re

import pytest

from ml.quantities import iec, quantity, si, significant

SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")


@pytest.mark.parametrize(
    ("value", "text"),
    [(7.036e10, "70360000000"), (0.000012345, "0.0000123"), (1.2e-7, "0.00000012"), (486.0, "486"), (0.5, "0.5"),
     (-2.25, "-2.25"), (0, "0"), (float("nan"), "?")],
)  # fmt: skip
def test_significant_is_fixed_point(value: float, text: str) -> None:
    assert significant(value) == text


def test_units_for_bytes_rates_and_percentages() -> None:
    assert iec(7.036e10, "B/s") == "65.5 GiB/s"
    assert iec(512) == "512 B"
    assert si(1500, "W") == "1.5 kW"
    assert si(70.4e9, "B/s") != iec(70.4e9, "B/s")  # IEC and SI differ: bytes go through iec
    assert quantity(7.036e10, "B/s") == "65.5 GiB/s"
    assert quantity(57.0, "°C") == "57 °C"
    assert quantity(12.345, "%") == "12.3%"
    assert quantity(0.42, "ratio") == "0.42"


@pytest.mark.parametrize("exponent", range(-9, 19))
def test_no_magnitude_reads_in_scientific_notation(exponent: int) -> None:
    value = 1.2345 * 10**exponent
    for text in (significant(value), si(value, "B/s"), iec(value), quantity(value, "W"), quantity(value)):
        assert not SCIENTIFIC.search(text), (value, text)
