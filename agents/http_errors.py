"""What an HTTP error answer from the service says: shared by the shipper and the scheduler adapters."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from tenacity import RetryError, Retrying, retry_if_exception_type, wait_random_exponential
from tenacity.stop import stop_base

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


class Unavailable(Exception):
    """The service did not answer, or answered with a status worth asking again, until the caller gave up."""


def post_json(
    http: httpx.Client,
    path: str,
    body: dict[str, Any],
    *,
    stop: stop_base,
    headers: dict[str, str] | None = None,
    max_wait_s: float = 15.0,
) -> httpx.Response:
    """POST a JSON body, again while the service is unreachable or answers 5xx/408/429, until `stop`; any other
    answer is returned as it is. Raises Unavailable with the last reason when `stop` says to give up."""

    def once() -> httpx.Response:
        try:
            response = http.post(
                path, content=orjson.dumps(body), headers={"Content-Type": "application/json", **(headers or {})}
            )
        except httpx.TransportError as exc:
            raise Unavailable(f"{http.base_url} unreachable: {exc}") from exc
        if retryable(response.status_code):
            raise Unavailable(f"{http.base_url} answered {response.status_code}: {error_message(response)}")
        return response

    try:
        for attempt in Retrying(
            retry=retry_if_exception_type(Unavailable),
            stop=stop,
            wait=wait_random_exponential(multiplier=0.5, max=max_wait_s),
        ):
            with attempt:
                return once()
    except RetryError as exc:
        raise Unavailable(str(exc.last_attempt.exception())) from exc
    raise AssertionError("unreachable")  # Retrying either returns or raises
