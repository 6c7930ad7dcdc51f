"""Sends spooled batches to the service, oldest first, and hands back the directives it answers with.

Retries with exponential backoff and jitter (tenacity) on network errors, 5xx, 408 and 429, honouring
Retry-After. A batch the service refuses for good (another 4xx) is retried a few times, then dropped
and counted, so one bad batch cannot block the queue forever. 401 and 403 stop the agent: no retry
will fix a wrong token, and the operator needs to hear it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx
import orjson
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_random_exponential

from agents.http_errors import error_message, retry_after, retryable
from agents.spool import Entry, Spool

log = logging.getLogger(__name__)

REFUSED_ATTEMPTS = 3  # tries for a batch answered with a non-retryable 4xx


class Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Refused(Exception):
    """A 4xx the service will keep giving for this batch."""


class AuthFailed(Exception):
    """401 or 403: stop and tell the operator."""


class Shipper:
    def __init__(
        self,
        spool: Spool,
        *,
        server: str,
        token: str,
        on_directives: Callable[[list[dict[str, Any]]], None],
        timeout: float = 10.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.spool = spool
        self.url = server.rstrip("/") + "/api/v1/ingest"
        self.on_directives = on_directives
        self.max_backoff = max_backoff
        self.stopping = threading.Event()
        self.auth_error: str | None = None
        self.sent = 0
        self.failures = 0  # consecutive, for the log
        self._client = httpx.Client(
            timeout=timeout,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
            },
        )

    def run(self) -> None:
        """Ship until `stopping` is set (or until the service refuses the token)."""
        while not self.stopping.is_set() and self.auth_error is None:
            entry = self.spool.peek(timeout=0.5)
            if entry is not None:
                self._ship(entry, self.stopping)

    def drain(self, timeout: float) -> bool:
        """Ship what is spooled now, for at most `timeout` seconds; True when nothing is left.

        Call it when `run` is not running (at exit, or for --once).
        """
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while len(self.spool) and not deadline.is_set() and self.auth_error is None:
                entry = self.spool.peek(timeout=0)
                if entry is not None:
                    self._ship(entry, deadline)
        finally:
            timer.cancel()
        return not len(self.spool)

    def close(self) -> None:
        self._client.close()

    def _ship(self, entry: Entry, stop: threading.Event) -> None:
        try:
            self._ship_with_retries(entry, stop)
        except AuthFailed as exc:
            self.auth_error = str(exc)
            log.error("%s", exc)

    def _ship_with_retries(self, entry: Entry, stop: threading.Event) -> None:
        refused = 0

        def wait(state: RetryCallState) -> float:
            backoff = wait_random_exponential(multiplier=0.5, max=self.max_backoff)(state)
            exc = state.outcome.exception() if state.outcome else None
            hint = exc.retry_after if isinstance(exc, Retryable) else None
            return max(backoff, min(hint or 0.0, self.max_backoff))

        def log_retry(state: RetryCallState) -> None:
            self.failures += 1
            exc = state.outcome.exception() if state.outcome else None
            if self.failures == 1 or self.failures % 20 == 0:
                log.warning("cannot ship (%s); %d batches spooled, retrying", exc, len(self.spool))

        def give_up(_state: RetryCallState) -> bool:
            return stop.is_set() or refused >= REFUSED_ATTEMPTS

        for attempt in Retrying(
            retry=retry_if_exception_type((Retryable, Refused)),
            wait=wait,
            sleep=lambda seconds: stop.wait(seconds) and None,
            stop=give_up,
            before_sleep=log_retry,
            retry_error_callback=lambda _state: None,
        ):
            with attempt:
                try:
                    self._post(entry)
                except Refused as exc:
                    refused += 1
                    if refused >= REFUSED_ATTEMPTS:
                        log.error("service refused batch %d %d times, dropping it: %s", entry.seq, refused, exc)
                        self.spool.reject(entry, reason=f"refused: {exc}")
                        return
                    raise

    def _post(self, entry: Entry) -> None:
        try:
            response = self._client.post(self.url, content=entry.read())
        except FileNotFoundError:
            self.spool.remove(entry)  # dropped by a full spool meanwhile
            return
        except httpx.HTTPError as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status in (401, 403):
            raise AuthFailed(
                f"the service refused this agent's token ({status}: {error_message(response)}); "
                "check --token (an agent-scope token, bound to this node name if bound at all); stopping"
            )
        if retryable(status):
            raise Retryable(f"HTTP {status}: {error_message(response)}", retry_after(response))
        if status >= 400:
            raise Refused(f"HTTP {status}: {error_message(response)}")
        if self.failures:
            log.info("service reachable again after %d failed attempts", self.failures)
            self.failures = 0
        self.spool.remove(entry)
        self.sent += 1
        directives = orjson.loads(response.content).get("directives") or []
        if directives:
            self.on_directives(directives)
