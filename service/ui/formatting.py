"""One formatting layer for the web UI's values: percentages and confidences, figures with their units (never in
scientific notation), and GPUs by index. Templates reach these as filters (registered in render.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC
from typing import Any

from markupsafe import Markup, escape

from ml.quantities import iec, quantity, significant
from service.gpu_names import GPU_IN_TEXT, by_address, kernel_pci, name_gpus
from service.ui import plots


def percent(value: float | None, digits: int = 0) -> str:
    """A share or a confidence (0 to 1) as a percentage: every confidence on every page goes through this."""
    return "—" if value is None else f"{value * 100:.{digits}f}%"


# Evidence keys by their suffix: what unit the number is in.
_SUFFIX_UNITS = (
    ("_bytes_per_s", "B/s"),
    ("_bytes", "B"),
    ("_mib", "MiB"),
    ("_pct", "%"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_gbps", "Gb/s"),
    ("_w", "W"),
)
_FRACTIONS = ("confidence", "share", "fraction")


def evidence_value(key: str, value: float) -> str:
    """A number from a finding's evidence, in the unit its name or its metric says."""
    name = key.lower()
    if any(name == f or name.endswith(f"_{f}") for f in _FRACTIONS) and 0 <= value <= 1:
        return percent(value)
    if unit := plots.unit_of(name):
        return quantity(value, unit)
    for suffix, unit in _SUFFIX_UNITS:
        if name.endswith(suffix):
            if unit == "MiB":
                return iec(value * 2**20)
            return quantity(value, unit)
    if isinstance(value, int) and abs(value) < 10**6:
        return f"{value:,}"
    return quantity(value)


def short(key: str, value: Any) -> str | None:
    """A finding's short scalar evidence field as text, or None when it is not short or not a scalar."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return evidence_value(key, value)
    if isinstance(value, str):
        ts = plots.parse_time(value) if len(value) >= 19 and value[10:11] == "T" else None
        if ts is not None:
            return f"{ts.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        return value if 0 < len(value) <= 80 else None
    if isinstance(value, list) and value and all(isinstance(v, int | str) and not isinstance(v, bool) for v in value):
        text = ", ".join(str(v) for v in value[:8]) + (f" (+{len(value) - 8})" if len(value) > 8 else "")
        return text if len(text) <= 120 else None
    return None


def number(value: float | None, unit: str = "") -> str:
    """A figure with its unit for a template: `{{ x | number("B") }}`; blank when unknown."""
    return "" if value is None else quantity(value, unit) if unit else significant(value, 4)


class GpuNames:
    """GPUs named by index where the inventory knows the PCI address a kernel line gave: "GPU 7", the address
    on hover ("GPU 7 (PCI 0000:df:00)" as plain text)."""

    def __init__(self, inventory: Iterable[tuple[str, int, str | None]]) -> None:
        self._index = by_address(inventory)

    def index(self, node: str | None, gpu: str) -> int | None:
        key = kernel_pci(gpu)
        return self._index.get((node, key)) if node and key else None

    def subject(self, node: str | None, subject: str) -> str:
        """A finding's subject ("node-3/0000:df:00", "node-3/7") as "node-3 GPU 7"."""
        owner, _, gpu = subject.rpartition("/")
        if not owner or not gpu:
            return subject
        index = self.index(node or owner, gpu)
        return f"{owner} GPU {index if index is not None else gpu}"

    def text(self, node: str | None, text: str) -> str:
        """A sentence with each GPU the inventory knows as "GPU 7 (PCI ...)": for plain text (a title, a CSV)."""
        return name_gpus(text, node, self._index)

    def html(self, node: str | None, text: str | None, limit: int | None = None) -> Markup:
        """A sentence for a page: each known GPU as "GPU 7" with its PCI address on hover, the rest escaped.

        `limit`: at most about that many characters, cut after a GPU's address rather than inside it (an address cut
        short is no address the inventory knows, and showed as "GPU 0000:d1:0")."""
        text = text or ""
        if limit is not None and len(text) > limit:
            cut = next((m.end() for m in GPU_IN_TEXT.finditer(text) if m.start() < limit < m.end()), limit)
            text = text[:cut].rstrip() + "…"
        return Markup(name_gpus(str(escape(text)), node, self._index, _gpu_span))


def _gpu_span(index: int, pci: str) -> str:
    return f'<span class="gpu" title="PCI {pci}">GPU {index}</span>'


def evidence_numbers(evidence: Mapping[str, Any], skip: Iterable[str]) -> list[tuple[str, str]]:
    """The evidence's short scalar fields (counts, rates, ratios, codes) as label/value pairs."""
    skipped = set(skip)
    out = []
    for key, value in evidence.items():
        if key in skipped:
            continue
        text = short(key, value)
        if text is not None:
            out.append((key.replace("_", " "), text))
    return out
