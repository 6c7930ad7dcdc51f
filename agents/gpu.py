"""GPU counters: scraped from dcgm-exporter (Prometheus text), or read through NVML when there is none.

dcgm-exporter is what clusters already run; NVML (nvidia-ml-py, agents/nvml.py) is the fallback on a node
without it. Both produce the same thing: per GPU, DCGM field name -> value, plus an inventory of the GPUs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# DCGM reports fields it cannot read as values just below INT64_MAX (DCGM_FT_INT64_BLANK and friends)
# or as FP64 blanks (>= 1e38 would be nonsense for any real counter either way).
_BLANK_INT = 9_223_372_036_854_775_000
_BLANK_FLOAT = 1e38
_PREFIXES = ("DCGM_FI_", "DCGM_EXP_")


@dataclass(slots=True)
class GpuReading:
    gpu: int
    fields: dict[str, float | None] = field(default_factory=dict)
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    hostname: str | None = None
    # What the exporter says holds the GPU (pod, namespace, container, hpc_job): the service's way to the job
    # when the agent cannot see the training processes.
    workload: dict[str, str] = field(default_factory=dict)
    # The GPU's NVLink fabric (NVML's fabric info: cluster, clique, state), on NVSwitch-fabric GPUs only.
    fabric: dict[str, Any] | None = None

    def inventory(self) -> dict[str, Any]:
        out = {
            "index": self.gpu,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "model": self.model,
            "fabric": self.fabric,
        }
        return {k: v for k, v in out.items() if v is not None}


class GpuSource(Protocol):
    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


def blank_to_none(value: float) -> float | None:
    if value != value or abs(value) >= _BLANK_FLOAT or value >= _BLANK_INT:  # NaN or a DCGM blank
        return None
    return value


# Labels that identify the GPU or the scrape, not the measurement. Any other label (e.g. `xid` on
# DCGM_EXP_XID_ERRORS_COUNT, one series per Xid code) becomes part of the field name.
_IDENTITY_LABELS = frozenset(
    {
        "gpu", "UUID", "uuid", "pci_bus_id", "device", "modelName", "Hostname", "hostname", "container",
        "namespace", "pod", "job", "instance", "DCGM_FI_DRIVER_VERSION", "GPU_I_PROFILE", "window_size_in_ms",
        "err_code", "err_msg", "hpc_job", "hpc_user", "pod_name", "pod_namespace", "container_name", "vgpu",
    }
)  # fmt: skip
# dcgm-exporter's workload labels (Kubernetes mode; --hpc-job-mapping-dir), with the names older versions used.
_WORKLOAD_LABELS = (
    ("pod", ("pod", "pod_name")),
    ("namespace", ("namespace", "pod_namespace")),
    ("container", ("container", "container_name")),
    ("hpc_job", ("hpc_job",)),
)
_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True, slots=True)
class _Series:
    gpu: int | None
    labels: dict[str, str]
    suffix: str  # `{xid="42"}` for labels beyond the identity ones, else ""
    workload: dict[str, str]  # blank labels (a GPU no pod holds) left out


def _series(raw: str) -> _Series:
    labels = {m.group(1): m.group(2).replace('\\"', '"').replace("\\\\", "\\") for m in _LABEL.finditer(raw)}
    try:
        gpu = int(labels["gpu"])
    except (KeyError, ValueError):
        gpu = None
    if "GPU_I_ID" in labels:
        gpu = None  # a MIG instance: the whole-GPU series carries the node's health
    extra = sorted((k, v) for k, v in labels.items() if k not in _IDENTITY_LABELS and k != "GPU_I_ID")
    suffix = "{" + ",".join(f'{k}="{v}"' for k, v in extra) + "}" if extra else ""
    workload = {}
    for key, names in _WORKLOAD_LABELS:
        value = next((labels[n] for n in names if labels.get(n)), None)
        if value:
            workload[key] = value
    return _Series(gpu, labels, suffix, workload)


class ExporterParser:
    """Every DCGM_FI_*/DCGM_EXP_* series of a dcgm-exporter page, grouped by GPU index.

    The exporter prints the same label sets on every scrape, so each distinct label string is parsed
    once and remembered: at a 1-second interval this is the agent's hottest loop, and the general
    Prometheus parser costs ~10x more. A page the fast path does not understand is handed to
    prometheus_client's parser, which stays the reference.
    """

    def __init__(self, max_cached: int = 65_536) -> None:
        self._cache: dict[str, _Series] = {}
        self._max_cached = max_cached

    def parse(self, text: str) -> list[GpuReading]:
        try:
            samples = list(self._fast(text))
        except ValueError:
            try:
                samples = list(_reference(text))
            except ValueError as exc:
                log.debug("unparseable exporter page (%s); keeping the lines that parse", exc)
                samples = list(self._fast(text, strict=False))
        gpus: dict[int, GpuReading] = {}
        for name, series, value in samples:
            if series.gpu is None or not name.startswith(_PREFIXES):
                continue  # node-level (NVSwitch, MIG) or not a DCGM field
            reading = gpus.get(series.gpu)
            if reading is None:
                labels = series.labels
                reading = gpus[series.gpu] = GpuReading(
                    series.gpu,
                    uuid=labels.get("UUID") or labels.get("uuid"),
                    pci_bus_id=labels.get("pci_bus_id"),
                    model=labels.get("modelName"),
                    hostname=labels.get("Hostname") or labels.get("hostname"),
                )
            if series.workload and not reading.workload:
                reading.workload = dict(series.workload)
            reading.fields[name + series.suffix] = blank_to_none(value)
        return [gpus[i] for i in sorted(gpus)]

    def _fast(self, text: str, *, strict: bool = True) -> Iterator[tuple[str, _Series, float]]:
        cache = self._cache
        for line in text.splitlines():
            if not line or line[0] == "#" or line.isspace():
                continue
            m = _LINE.match(line)
            if m is None:
                if strict:
                    raise ValueError(line)
                continue
            name, raw, value = m.groups()
            try:
                number = float(value)
            except ValueError:
                if strict:
                    raise
                continue
            series = cache.get(raw or "")
            if series is None:
                if len(cache) >= self._max_cached:
                    cache.clear()
                series = cache[raw or ""] = _series(raw or "")
            yield name, series, number


def _reference(text: str) -> Iterator[tuple[str, _Series, float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The reference parser renames counters' samples (`_total`); keep the exporter's own name.
            name = family.name if family.type == "counter" else sample.name
            raw = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            yield name, _series(raw), float(sample.value)


def parse_exporter(text: str) -> list[GpuReading]:
    return ExporterParser().parse(text)


class DcgmExporter:
    """Scrapes one dcgm-exporter /metrics URL."""

    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        self.url = url
        self._client = httpx.Client(timeout=timeout)
        self._failing = False
        self._parser = ExporterParser()

    def read(self) -> list[GpuReading]:
        try:
            response = self._client.get(self.url)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            if not self._failing:
                log.warning("cannot scrape dcgm-exporter at %s: %s (will keep trying)", self.url, exc)
            self._failing = True
            return []
        if self._failing:
            log.info("dcgm-exporter at %s answers again", self.url)
            self._failing = False
        return self._parser.parse(response.text)

    def close(self) -> None:
        self._client.close()
