"""What an HTTP error answer from the service says: shared by the shipper and the scheduler adapters."""

from __future__ import annotations

import httpx
import orjson

# Worth asking again: the service is down or busy (5xx), timed out the request, or asks the client to slow down.
# Any other 4xx is an answer about the request itself, and repeating it changes nothing.
_RETRYABLE_STATUS = frozenset({408, 429})


def retryable(status: int) -> bool:
    """Whether an answer with this status is worth the same request again later."""
    return status >= 500 or status in _RETRYABLE_STATUS


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
