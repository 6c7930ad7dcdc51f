"""A small client for faultline's decision API, as a scheduler adapter uses it: pending decisions, acks.

Survives the service being down: network errors, 5xx, 408 and 429 are retried with exponential backoff
and jitter (tenacity), honouring Retry-After, until the service answers (or the adapter stops, or the
caller's patience runs out). One log line when an outage starts and one when it ends, not one per retry.
401 and 403 raise `AuthFailed`: no retry fixes a wrong token. A 409 on ack (already acknowledged with
another outcome, expired, not pending) is final: reported, never retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_random_exponential

from agents.http_errors import error_message, retry_after, retryable

log = logging.getLogger(__name__)

# The node-level kinds a scheduler acts on; restart/rollback/diagnose are for the job's owner or a person.
# reset_gpu names one GPU of the node: the decision's `gpu` (its index), else its `gpu_pci` (PCI bus id).
NODE_KINDS = ("evict", "cordon", "return", "reset_gpu")
MAX_MESSAGE = 1000  # an ack message is a summary (stderr can be long)
# The states in which faultline holds a node out of service: the adapter watches these for a return.
OUT_OF_SERVICE = ("cordoned", "evicted", "in_repair")


class AuthFailed(Exception):
    """401 or 403: the token is wrong, revoked, or lacks the scheduler scope. Stop and say so."""


class GaveUp(Exception):
    """Stopped retrying: the adapter is stopping, or the caller's patience ran out."""


class Refused(Exception):
    """The service refused to list decisions (a 4xx other than 401/403): a wrong URL or an old service."""


class _Unavailable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class AckResult:
    delivered: bool  # False: the service refused it for good (409, 404, ...); final, not retried
    status: int
    message: str


class FaultlineClient:
    """Pending decisions and acknowledgements over HTTP, with a bearer token."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        stop: threading.Event | None = None,
        patience_s: float | None = None,
        timeout_s: float = 10.0,
        max_backoff_s: float = 10.0,  # a scheduler should hear of an eviction soon after an outage
        page_size: int = 100,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.stop = stop or threading.Event()
        self.patience_s = patience_s  # None: retry until the service answers or `stop` is set
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.page_size = page_size
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "faultline-adapter"},
            transport=transport,
        )
        self._lock = threading.Lock()
        self._down_since: float | None = None  # monotonic start of the current outage
        self._failed_attempts = 0

    def close(self) -> None:
        self._http.close()

    # -- reading -----------------------------------------------------------------------------------

    def pending(self, kinds: Sequence[str] = NODE_KINDS, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Pending decisions of these kinds, oldest first (so a later decision for a node wins).

        With `wait_s` and nothing pending yet, the service holds the first request up to that long and
        answers as soon as a decision arrives (its long poll).
        """
        by_id: dict[int, dict[str, Any]] = {}
        params: dict[str, Any] = {"state": "pending", "kind": list(kinds), "limit": self.page_size}
        if wait_s > 0:
            params["wait"] = round(wait_s)
        while True:
            response = self._request(
                "GET",
                "/api/v1/decisions",
                params=params,
                timeout=httpx.Timeout(self.timeout_s, read=wait_s + self.timeout_s),
            )
            if response.status_code >= 400:
                raise Refused(f"listing decisions: HTTP {response.status_code}: {error_message(response)}")
            page = self._json(response)
            for item in page.get("items") or []:
                by_id[int(item["id"])] = item
            if not page.get("next_cursor"):
                return [by_id[i] for i in sorted(by_id)]
            params = {**params, "cursor": page["next_cursor"]}
            params.pop("wait", None)

    # -- acknowledging -----------------------------------------------------------------------------

    def ack(self, decision_id: int, outcome: str, message: str) -> AckResult:
        """Acknowledge a decision: `done`, `failed` or `rejected`. Retries while the service is down."""
        body = {"outcome": outcome, "message": message[:MAX_MESSAGE]}
        response = self._request("POST", f"/api/v1/decisions/{decision_id}/ack", json=body)
        if response.status_code < 300:
            return AckResult(True, response.status_code, "")
        return AckResult(False, response.status_code, error_message(response))

    # -- nodes (returns) -----------------------------------------------------------------------------

    def out_of_service(self) -> list[str]:
        """Names of the nodes faultline holds out of service (cordoned, evicted, in repair), by name."""
        names: set[str] = set()
        for state in OUT_OF_SERVICE:
            params: dict[str, Any] = {"state": state, "limit": 1000}
            while True:
                response = self._request("GET", "/api/v1/nodes", params=params)
                if response.status_code >= 400:
                    raise Refused(f"listing nodes: HTTP {response.status_code}: {error_message(response)}")
                page = self._json(response)
                names.update(str(item["name"]) for item in page.get("items") or [])
                if not page.get("next_cursor"):
                    break
                params = {**params, "cursor": page["next_cursor"]}
        return sorted(names)

    def report_return(self, node: str, reason: str) -> AckResult:
        """Tell the service the scheduler has put the node back in service (it runs the node's return gate).
        Retries while the service is down; a 409 (a take-out decision still waits on us) comes back undelivered."""
        body = {"reason": reason[:MAX_MESSAGE]}
        response = self._request("POST", f"/api/v1/nodes/{quote(node, safe='')}/return", json=body)
        if response.status_code < 300:
            return AckResult(True, response.status_code, "")
        return AckResult(False, response.status_code, error_message(response))

    # -- jobs (a launcher's registration) ----------------------------------------------------------

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job as the service holds it; None when it does not know it yet."""
        response = self._request("GET", f"/api/v1/jobs/{job_id}")
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise Refused(f"reading job {job_id}: HTTP {response.status_code}: {error_message(response)}")
        return self._json(response)

    def register_job(self, body: dict[str, Any]) -> None:
        """Register or update a job (world size, parallelism, rank placement)."""
        response = self._request("POST", "/api/v1/jobs", json=body)
        if response.status_code >= 400:
            status = response.status_code
            raise Refused(f"registering job {body.get('job_id')}: HTTP {status}: {error_message(response)}")

    # -- plumbing ----------------------------------------------------------------------------------

    def _check(self, response: httpx.Response) -> None:
        status = response.status_code
        if status in (401, 403):
            raise AuthFailed(
                f"the service refused the adapter's token ({status}: {error_message(response)}); it needs a token "
                "with scope scheduler (faultline token create --scope scheduler)"
            )
        if retryable(status):
            raise _Unavailable(f"HTTP {status}: {error_message(response)}", retry_after(response))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send until the service answers something other than an outage; 4xx come back to the caller."""
        started = time.monotonic()

        def wait(state: RetryCallState) -> float:
            backoff = wait_random_exponential(multiplier=0.5, max=self.max_backoff_s)(state)
            exc = state.outcome.exception() if state.outcome else None
            hint = exc.retry_after if isinstance(exc, _Unavailable) else None
            return max(backoff, min(hint or 0.0, self.max_backoff_s))

        def give_up(_state: RetryCallState) -> bool:
            if self.stop.is_set():
                return True
            return self.patience_s is not None and time.monotonic() - started >= self.patience_s

        def gave_up(state: RetryCallState) -> httpx.Response:
            exc = state.outcome.exception() if state.outcome else None
            raise GaveUp(f"faultline service at {self.url} unavailable ({exc})")

        for attempt in Retrying(
            retry=retry_if_exception_type(_Unavailable),
            wait=wait,
            sleep=lambda seconds: self.stop.wait(seconds) and None,
            stop=give_up,
            before_sleep=self._outage,
            retry_error_callback=gave_up,
        ):
            with attempt:
                try:
                    response = self._http.request(method, path, **kwargs)
                except httpx.HTTPError as exc:
                    raise _Unavailable(f"{type(exc).__name__}: {exc}") from exc
                self._check(response)
        self._recovered()
        return response

    def _outage(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        with self._lock:
            self._failed_attempts += 1
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning("faultline service at %s unavailable (%s); retrying with backoff until it answers", self.url, exc)

    def _recovered(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            down_s, attempts = time.monotonic() - self._down_since, self._failed_attempts
            self._down_since, self._failed_attempts = None, 0
        log.info("faultline service reachable again after %.0f s (%d failed attempts)", down_s, attempts)

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        body = orjson.loads(response.content)
        if not isinstance(body, dict):
            raise ValueError(f"unexpected answer from the service: {response.text[:200]}")
        return body
