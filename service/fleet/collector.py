"""Fleet repair times over the last day as gauges on /metrics, read from the database at scrape time.

The `faultline_repair_seconds` histograms are observed by the process that completes each stage: detect and
decide in the Celery workers, act and return in the API. The API's /metrics sums the workers' only when they share
its PROMETHEUS_MULTIPROC_DIR (one host); these gauges come from the stored incidents, so every API replica shows
all four stages whatever process completed them. Cached briefly: a scrape every few seconds reads the tables at
most once per CACHE_S.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ml import repair_times
from service.fleet import service

log = logging.getLogger(__name__)

WINDOW_S = 86_400.0
CACHE_S = 15.0


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _families(times: list[repair_times.IncidentTimes]) -> list[Metric]:
    quantiles = GaugeMetricFamily(
        "faultline_repair_window_seconds",
        "p50 and p90 of each repair stage over the incidents opened in the last 24 h (from the database)",
        labels=["stage", "quantile"],
    )
    counts = GaugeMetricFamily(
        "faultline_repair_window_samples",
        "Samples behind faultline_repair_window_seconds: incidents (node outages for return), last 24 h",
        labels=["stage"],
    )
    for group in repair_times.aggregate(times, by="fleet"):
        for stage, summary in group.stages.items():
            counts.add_metric([stage], summary.count)
            if summary.count:
                quantiles.add_metric([stage, "0.5"], summary.p50 or 0.0)
                quantiles.add_metric([stage, "0.9"], summary.p90 or 0.0)
    return [quantiles, counts]


def exposition(factory: sessionmaker[Session], cache: dict[str, Any]) -> bytes:
    """The gauges in Prometheus' text format; empty when the database cannot be read (the rest of /metrics stays)."""
    if cache.get("at") is not None and time.monotonic() - cache["at"] < CACHE_S:
        return bytes(cache["body"])
    try:
        with factory() as session:
            times = service.window_times(session, window_s=WINDOW_S, now=datetime.now(UTC))
    except SQLAlchemyError as exc:
        log.warning("repair-time gauges skipped: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(_families(times)))  # type: ignore[arg-type]
    body = generate_latest(registry)
    cache.update(at=time.monotonic(), body=body)
    return body
