"""ASGI entry point for uvicorn: `uvicorn service.asgi:app`."""

from service.app import create_app
from service.gc_tuning import tune_for_serving

app = create_app()
tune_for_serving()  # each uvicorn worker imports this module: once per serving process
