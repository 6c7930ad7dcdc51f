"""ASGI entry point for uvicorn: `uvicorn service.asgi:app`."""

from service.app import create_app

app = create_app()
