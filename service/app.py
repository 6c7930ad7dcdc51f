"""The FastAPI app factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

import faultline
from service import health
from service.config import Settings, get_settings
from service.db import get_engine, make_sessionmaker
from service.errors import FaultlineError, ServiceUnavailable
from service.ingest import routes as ingest_routes
from service.ingest.schemas import IngestBatch
from service.ingest.writer import IngestWriter
from service.jobs import routes as jobs_routes
from service.security import TokenCache
from service.validation import error_details

log = logging.getLogger(__name__)


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
            writer.stop()

    app = FastAPI(
        title="faultline",
        version=faultline.__version__,
        description="Finds the machine that breaks a GPU training job, shows the evidence, "
        "and tells the scheduler to evict it.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.sessionmaker = factory
    app.state.ingest_writer = writer
    app.state.token_cache = TokenCache(settings.token_cache_seconds)

    app.include_router(health.router)
    app.include_router(ingest_routes.router)
    app.include_router(jobs_routes.router)
    _install_error_handlers(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _error_response(exc: FaultlineError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=exc.headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(FaultlineError)
    async def _faultline_error(_: Request, exc: FaultlineError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = error_details(exc.errors())
        first = details[0] if details else {"field": "body", "message": "invalid request"}
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        return JSONResponse(
            {"error": "invalid", "message": f"{first['field']}: {first['message']}{more}", "details": details},
            status_code=422,
        )

    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", exc)
        return _error_response(ServiceUnavailable("database unavailable; retry later"))

    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(psycopg.OperationalError, _database_down)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema, plus the ingest body (read by hand for speed and size limits)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    batch = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(batch.pop("$defs", {}))
    components["IngestBatch"] = batch
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from `faultline token create --scope agent|scheduler|operator|admin`.",
    }
    schema["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema
