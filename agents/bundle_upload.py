"""Upload an evidence bundle: PUT /api/v1/nodes/{node}/bundles/{id} with the agent token.

Again (tenacity, exponential backoff with jitter) while the service is unreachable or answers 5xx/408/429, until
`give_up_s`; any other answer is final: 201/200 stored, 413 over the service's cap, 401/403 a wrong token."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from agents.http_errors import error_message, retryable

log = logging.getLogger(__name__)


class _Again(Exception):
    pass


@dataclass
class Uploaded:
    status: int  # the service's answer; 0: never reached it
    message: str

    @property
    def stored(self) -> bool:
        return self.status in (200, 201)


def upload(
    *, server: str, token: str, node: str, bundle_id: str, body: bytes, give_up_s: float = 300.0, timeout: float = 60.0
) -> Uploaded:
    url = f"{server.rstrip('/')}/api/v1/nodes/{node}/bundles/{bundle_id}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"}
    with httpx.Client(timeout=timeout, headers=headers) as http:

        def once() -> Uploaded:
            try:
                response = http.put(url, content=body)
            except httpx.TransportError as exc:
                raise _Again(f"{server} unreachable: {exc}") from exc
            if retryable(response.status_code):
                raise _Again(f"HTTP {response.status_code}: {error_message(response)}")
            return Uploaded(response.status_code, error_message(response) if response.status_code >= 400 else "")

        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(_Again),
                stop=stop_after_delay(give_up_s),
                wait=wait_random_exponential(multiplier=0.5, max=15.0),
            ):
                with attempt:
                    return once()
        except RetryError as exc:
            return Uploaded(0, str(exc.last_attempt.exception()))
    raise AssertionError("unreachable")  # Retrying either returns or raises
