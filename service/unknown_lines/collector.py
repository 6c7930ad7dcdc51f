"""Distinct unknown-line forms of the last 24 h on /metrics, read from the database at scrape time, so every API
replica shows every form whichever replica counted it. Cached briefly, as the repair-time gauges are
(service/fleet/collector.py): a scrape every few seconds reads the table at most once per CACHE_S."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from service.unknown_lines import service

log = logging.getLogger(__name__)

WINDOW = timedelta(hours=24)
CACHE_S = 15.0


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def family(by_source: dict[str, int]) -> Metric:
    gauge = GaugeMetricFamily(
        "faultline_unknown_log_forms",
        "Distinct forms of log lines that look like errors but match no known form, seen in the last 24 h "
        "(from the database)",
        labels=["source"],
    )
    for source, forms in sorted(by_source.items()):
        gauge.add_metric([source], forms)
    return gauge


def exposition(factory: sessionmaker[Session], cache: dict[str, Any]) -> bytes:
    """The gauge in Prometheus' text format; empty when the database cannot be read (the rest of /metrics stays)."""
    if cache.get("at") is not None and time.monotonic() - cache["at"] < CACHE_S:
        return bytes(cache["body"])
    try:
        with factory() as session:
            by_source = service.forms_by_source(session, since=datetime.now(UTC) - WINDOW)
    except SQLAlchemyError as exc:
        log.warning("unknown-line gauge skipped: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([family(by_source)]))  # type: ignore[arg-type]
    body = generate_latest(registry)
    cache.update(at=time.monotonic(), body=body)
    return body
