"""Mounts the web UI on the app: its pages, its forms and its static files (served here: no CDN)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from service.ui.render import STATIC_DIR
from service.ui.routes import (
    breaker,
    bundles,
    channels,
    decisions,
    fleet,
    incident_list,
    incidents,
    jobs,
    nodes,
    overview,
    shared_incidents,
    signin,
    silences,
    tokens,
    unknown_lines,
    whatif,
)


def install(app: FastAPI, *, max_body_size: int) -> None:
    for module in (signin, overview, decisions, incident_list, silences, channels, tokens, incidents, nodes, jobs):
        app.include_router(module.router, max_body_size=max_body_size)
    app.include_router(fleet.router, max_body_size=max_body_size)
    app.include_router(whatif.router, max_body_size=max_body_size)
    app.include_router(unknown_lines.router, max_body_size=max_body_size)
    app.include_router(bundles.router, max_body_size=max_body_size)
    app.include_router(breaker.router, max_body_size=max_body_size)
    app.include_router(shared_incidents.router, max_body_size=max_body_size)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
