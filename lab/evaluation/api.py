"""The few API calls `faultline eval` makes, as a scheduler or operator would make them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

PAGE_LIMIT = 100
MAX_PAGES = 50  # 5,000 decisions for one scenario would be a runaway pipeline; stop reading there


class ApiError(Exception):
    """The API answered something the eval cannot use; the message says what, for the report."""


class EndpointMissing(ApiError):
    """The API has no such route (FastAPI's bare 404): that part of the service is not deployed."""


class Api:
    """An HTTP client with an operator token."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None):
        self.url = url
        self._client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON body of a 2xx answer; None for the service's own 404 (an unknown job or incident)."""
        where = f"{method} {path}"
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(f"{where}: the API at {self.url} did not answer ({exc})") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code == 404:
            if isinstance(body, dict) and body.get("error") == "not_found":
                return None
            raise EndpointMissing(f"{where} answered 404: the API has no such endpoint (is the diagnosis pipeline in?)")
        if response.status_code >= 400:
            message = (body.get("message") or body.get("detail")) if isinstance(body, dict) else response.text[:200]
            raise ApiError(f"{where} answered {response.status_code}: {message}")
        if body is None:
            raise ApiError(f"{where} answered {response.status_code} with no JSON body")
        return body

    def register_job(
        self,
        *,
        job_id: str,
        world_size: int,
        hang_timeout_s: int,
        tp: int = 1,
        pp: int = 1,
        ranks: list[dict[str, Any]] | None = None,
    ) -> None:
        """Register the job before its agents report, so it has its hang timeout and parallelism from the start
        (ranks in Megatron's order: tensor-parallel fastest, then data, then pipeline); `ranks`, the rank-to-node
        map a scheduler knows, for nodes whose agents see no training process."""
        body: dict[str, Any] = {
            "job_id": job_id,
            "world_size": world_size,
            "parallelism": {"tp": tp, "pp": pp, "dp": world_size // (tp * pp), "order": "tp-dp-pp"},
            "hang_timeout_s": hang_timeout_s,
        }
        if ranks:
            body["ranks"] = ranks
        self._request("POST", "/api/v1/jobs", json=body)

    def _pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            query = {**params, "limit": PAGE_LIMIT, **({"cursor": cursor} if cursor else {})}
            page = self._request("GET", path, params=query)
            if page is None:
                return items  # the job is not known yet: nothing decided about it
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise ApiError(f"GET {path} answered an unexpected body (no `items` list)")
            items += [i for i in page["items"] if isinstance(i, dict)]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return items

    def decisions(self, job_id: str) -> list[dict[str, Any]]:
        """Every decision about the job, in any state."""
        return self._pages("/api/v1/decisions", {"job": job_id})

    def shared_cordons(self, nodes: Iterable[str]) -> list[dict[str, Any]]:
        """The cordons of shared incidents on these nodes (an NVLink domain drained whole): decided for a component,
        they belong to no job, so the job's list leaves them out."""
        out = []
        for node in nodes:
            items = self._pages("/api/v1/decisions", {"node": node, "kind": "cordon"})
            out += [d for d in items if d.get("shared_incident_id") is not None]
        return out

    def incidents(self, job_id: str) -> list[dict[str, Any]]:
        """Every incident of the job in full, with its suspects and its findings (the calibration report reads
        each finding's detector and confidence): the list leaves the findings out, so each is read on its own."""
        listed = self._pages("/api/v1/incidents", {"job": job_id})
        out = []
        for item in listed:
            if "id" in item:
                detail = self._request("GET", f"/api/v1/incidents/{item['id']}")
                item = detail if isinstance(detail, dict) else item
            out.append(item)
        return out
