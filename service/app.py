"""The FastAPI app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import api_docs, health, openapi
from service.alerts import routes as alerts_routes
from service.breaker import routes as breaker_routes
from service.bundles import routes as bundles_routes
from service.checks import routes as checks_routes
from service.config import Settings, get_settings
from service.db import get_engine, make_sessionmaker
from service.decisions import routes as decisions_routes
from service.decisions.waiting import DecisionWaiter
from service.diagnosis.trigger import DiagnosisTrigger
from service.directives import routes as directives_routes
from service.directives.cache import DirectiveCache
from service.errors import FaultlineError, InvalidInput, NotFound, error_response
from service.fleet import routes as fleet_routes
from service.incidents import routes as incidents_routes
from service.ingest import routes as ingest_routes
from service.ingest.writer import IngestWriter
from service.jobs import routes as jobs_routes
from service.nodes import routes as nodes_routes
from service.notify import routes as notify_routes
from service.nvlink import routes as nvlink_routes
from service.planned import routes as planned_routes
from service.preflight import routes as preflight_routes
from service.security import AuthenticateBeforeBody, TokenCache
from service.shared_causes import routes as shared_causes_routes
from service.silences import routes as silences_routes
from service.strict_input import RejectUnstorableText
from service.tokens import routes as tokens_routes
from service.ui import render as ui_render
from service.ui import router as ui_router
from service.unknown_lines import routes as unknown_lines_routes
from service.validation import invalid


def _version() -> str:
    # The installed distribution's version (pyproject.toml's), read from its metadata rather than from the CLI
    # package, so the service does not import faultline/, which imports the service.
    try:
        return version("faultline")
    except PackageNotFoundError:  # a source tree that was never installed
        return "dev"


def create_app(settings: Settings | None = None, *, factory: sessionmaker[Session] | None = None) -> FastAPI:
    settings = settings or get_settings()
    factory = factory or make_sessionmaker(get_engine(settings.sqlalchemy_url))
    writer = IngestWriter(
        factory,
        max_batches=settings.ingest_flush_max_batches,
        max_wait_ms=settings.ingest_flush_max_wait_ms,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        writer.start()
        try:
            yield
        finally:
            await app.state.decision_waiter.close()
            writer.stop()

    # /docs and /redoc from the Swagger UI and ReDoc files fastapi-offline ships, so they work without internet;
    # /redoc is service/api_docs.py's (ReDoc's badge would fetch its logo from a CDN).
    app = FastAPIOffline(
        redoc_url=None,
        favicon_url="/static/favicon.svg",
        title="faultline",
        version=_version(),
        description="Finds the machine that breaks a GPU training job, shows the evidence, "
        "and tells the scheduler to evict it.",
        lifespan=lifespan,
        # Stable operation ids (the route function's name) for clients generated from the schema.
        generate_unique_id_function=lambda route: route.name,
        # faultline exports Prometheus metrics; FastAPI's OpenTelemetry hooks would only cost a provider
        # lookup on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.sessionmaker = factory
    app.state.ingest_writer = writer
    app.state.token_cache = TokenCache(settings.token_cache_seconds)
    app.state.directives = DirectiveCache(factory)
    app.state.diagnosis_trigger = DiagnosisTrigger(settings.broker_url)
    app.state.decision_waiter = DecisionWaiter(settings.sqlalchemy_url)

    app.include_router(health.router)
    app.include_router(api_docs.router)
    app.add_middleware(ingest_routes.IngestFastPath)
    app.add_middleware(AuthenticateBeforeBody)
    # Outermost: a URL no route could store is refused before any of them runs.
    app.add_middleware(RejectUnstorableText)
    # Bodies are read (and parsed) before a route's token check runs: each route's limit bounds what a
    # caller without a token can make a process hold. Alertmanager's notifications may be as large as
    # agents' batches; everything else is small JSON or a form.
    app.include_router(alerts_routes.router, max_body_size=settings.ingest_max_body_bytes)
    # Evidence bundles are agents' tar.gz uploads: the route refuses one over its cap with a 413 that names it
    # (after the token check); the router's limit, a chunk above, is the backstop.
    app.include_router(bundles_routes.router, max_body_size=settings.bundle_max_bytes + 1024 * 1024)
    small = settings.api_max_body_bytes
    for routes in (jobs_routes, directives_routes, incidents_routes, decisions_routes, nodes_routes, checks_routes):
        app.include_router(routes.router, max_body_size=small)
    for routes in (notify_routes, silences_routes, tokens_routes, fleet_routes, unknown_lines_routes):
        app.include_router(routes.router, max_body_size=small)
    app.include_router(breaker_routes.router, max_body_size=small)
    app.include_router(planned_routes.router, max_body_size=small)
    # A preflight's outcome lists every group of every round: a large allocation's is as large as a batch.
    app.include_router(preflight_routes.router, max_body_size=settings.ingest_max_body_bytes)
    app.include_router(nvlink_routes.router, max_body_size=small)
    app.include_router(shared_causes_routes.router, max_body_size=small)
    ui_router.install(app, max_body_size=small)
    _install_error_handlers(app)
    app.openapi = lambda: openapi.build(app)  # type: ignore[method-assign]
    return app


def _install_error_handlers(app: FastAPI) -> None:
    async def _known_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, FaultlineError) and ui_render.is_ui_request(request):
            return ui_render.error_page(request, exc)
        response = error_response(exc)
        if response is None:
            raise exc
        return response

    for known in (FaultlineError, OperationalError, psycopg.OperationalError, DataError, psycopg.DataError):
        app.add_exception_handler(known, _known_error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if ui_render.is_ui_request(request) and exc.status_code == 404:
            return ui_render.error_page(request, NotFound(f"nothing at {request.url.path}"))
        if exc.status_code == 400:
            # Starlette's answer to a body it cannot parse (not JSON, not UTF-8): invalid input.
            return await _known_error(request, InvalidInput(f"body: {exc.detail}"))
        # Unknown paths and methods answer in the one error shape too.
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, f"http_{exc.status_code}")
        body = {"error": code, "message": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return await _known_error(request, invalid(exc.errors()))
