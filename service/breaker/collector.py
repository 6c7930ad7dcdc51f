"""The fleet circuit breaker on /metrics, read from its row at scrape time, so every API replica shows the one state
whichever process tripped it. Cached briefly, as the other database gauges are (service/unknown_lines/collector.py)."""

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

from service.breaker import service
from service.breaker.schemas import BreakerOut
from service.config import Settings

log = logging.getLogger(__name__)

CACHE_S = 5.0


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def families(state: BreakerOut) -> list[Metric]:
    """The gauges: tripped (1 or 0), nodes out against the limit, decisions held for a person."""
    values = (
        ("faultline_breaker_tripped", "1 while the fleet circuit breaker is tripped (take-outs wait for a person)",
         1 if state.state == "tripped" else 0),
        ("faultline_breaker_out_nodes", "Nodes faultline took out automatically, since the window's start or the "
         "last reset, still out", state.out_now),
        ("faultline_breaker_limit_nodes", "The most nodes automation may have out before the breaker trips",
         state.limit_now),
        ("faultline_breaker_held_decisions", "Decisions the breaker held that still wait for a person",
         state.held_decisions),
    )  # fmt: skip
    out: list[Metric] = []
    for name, documentation, value in values:
        gauge = GaugeMetricFamily(name, documentation)
        gauge.add_metric([], value)
        out.append(gauge)
    return out


def exposition(factory: sessionmaker[Session], settings: Settings, cache: dict[str, Any]) -> bytes:
    """The gauges in Prometheus' text format; empty when the database cannot be read (the rest of /metrics stays)."""
    if cache.get("at") is not None and time.monotonic() - cache["at"] < CACHE_S:
        return bytes(cache["body"])
    try:
        with factory() as session:
            state = service.status(session, now=datetime.now(UTC), settings=settings)
            session.rollback()  # status may create the missing row: a scrape writes nothing
    except SQLAlchemyError as exc:
        log.warning("breaker gauges skipped: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families(state)))  # type: ignore[arg-type]
    body = generate_latest(registry)
    cache.update(at=time.monotonic(), body=body)
    return body
