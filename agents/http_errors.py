"""What an HTTP error answer from the service says: shared by the shipper and the scheduler adapters."""

from __future__ import annotations

import httpx
import orjson


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds, if the service sent one."""
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def error_message(response: httpx.Response) -> str:
    """The `message` of faultline's error body, else the start of the body."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text[:300]
    return str(body.get("message", response.text[:300])) if isinstance(body, dict) else response.text[:300]
