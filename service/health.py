"""/healthz (database and broker status) and /metrics (Prometheus)."""

from __future__ import annotations

import os

import redis
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from service.breaker import collector as breaker_gauges
from service.fleet import collector as repair_gauges
from service.unknown_lines import collector as unknown_gauges

router = APIRouter(tags=["health"])


def _check_database(request: Request) -> str:
    try:
        with request.app.state.sessionmaker() as session:
            session.execute(text("SET LOCAL statement_timeout = 2000"))
            session.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _check_broker(request: Request) -> str:
    try:
        client = redis.Redis.from_url(request.app.state.settings.broker_url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"


@router.get(
    "/healthz",
    responses={
        200: {
            "description": "Both dependencies answer",
            "content": {"application/json": {"example": {"status": "ok", "database": "ok", "broker": "ok"}}},
        },
        503: {"description": "The database or the broker is unreachable"},
    },
)
async def healthz(request: Request) -> JSONResponse:
    """Liveness and readiness: 200 when the database and the broker answer, 503 otherwise."""
    database = await run_in_threadpool(_check_database, request)
    broker = await run_in_threadpool(_check_broker, request)
    healthy = database == "ok" and broker == "ok"
    return JSONResponse(
        {"status": "ok" if healthy else "degraded", "database": database, "broker": broker},
        status_code=200 if healthy else 503,
    )


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        body = generate_latest(registry)
    else:
        body = generate_latest()
    # Fleet repair times from the database, whichever process completed each stage (service/fleet/collector.py).
    state = request.app.state
    if not hasattr(state, "repair_gauges"):
        state.repair_gauges = {}
    body += repair_gauges.exposition(state.sessionmaker, state.repair_gauges)
    # Distinct unknown-line forms of the last day, likewise from the database (service/unknown_lines/collector.py).
    if not hasattr(state, "unknown_gauges"):
        state.unknown_gauges = {}
    body += unknown_gauges.exposition(state.sessionmaker, state.unknown_gauges)
    # The fleet circuit breaker's state, from its row (service/breaker/collector.py).
    if not hasattr(state, "breaker_gauges"):
        state.breaker_gauges = {}
    body += breaker_gauges.exposition(state.sessionmaker, state.settings, state.breaker_gauges)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
