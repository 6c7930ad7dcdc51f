"""A replay as the service sees it: a registered job, each node's batches on the agent protocol, then what the
worker made of them (incidents and decisions), read until they stop changing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from agents.replay.timeline import NodeReplay

AGENT_VERSION = "faultline-replay"
BATCH_ITEMS = 5_000
PAGE_LIMIT = 100
MAX_PAGES = 20
# The worker's periodic pass runs every 5 s by default: a few of them before a quiet outcome counts as final.
MIN_WAIT_S = 12.0
QUIET_S = 8.0
NODE_KINDS = frozenset({"evict", "cordon", "diagnose", "reset_gpu"})


class ServiceError(Exception):
    """The service refused or did not answer; the message says which call and why."""


@dataclass
class Outcome:
    """What the service decided about a replayed job."""

    job_id: str
    incidents: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    waited_s: float = 0.0
    settled: bool = False  # False: still changing, or no whole pass had read it, when the wait ran out

    def node_decisions(self, node: str) -> list[dict[str, Any]]:
        """Decisions that act on `node` itself (evict, cordon, diagnose, reset a GPU)."""
        return [d for d in self.decisions if d.get("node") == node and d.get("kind") in NODE_KINDS]

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "incidents": self.incidents,
            "decisions": self.decisions,
            "waited_s": round(self.waited_s, 1),
            "settled": self.settled,
        }


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)[:300]
    return str(body)[:300]


class ReplayClient:
    """HTTP calls of a replay: an agent token to post batches, a scheduler or operator token for the rest."""

    def __init__(
        self,
        url: str,
        *,
        token: str,
        agent_token: str,
        timeout: float = 15.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._people = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, transport=transport
        )
        self._agent = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {agent_token}"}, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._people.close()
        self._agent.close()

    def _call(self, client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(f"{method} {path}: the service at {self.url} did not answer ({exc})") from None
        if response.status_code >= 400:
            raise ServiceError(f"{method} {path} answered {response.status_code}: {_error_text(response)}")
        return response.json() if response.content else None

    def register(self, job_id: str, nodes: Sequence[NodeReplay], *, hang_timeout_s: int = 300) -> None:
        """Register the job with the ranks its logs name on each node (the scheduler's rank map)."""
        ranks = rank_map(nodes)
        body: dict[str, Any] = {
            "job_id": job_id,
            "world_size": max((r["rank"] for r in ranks), default=0) + 1,
            "hang_timeout_s": hang_timeout_s,
            "ranks": ranks,
        }
        self._call(self._people, "POST", "/api/v1/jobs", json=body)

    def send(self, job_id: str, node: NodeReplay, *, now: datetime) -> int:
        """Post a node's events (and its GPU readings and inventory) as agent batches; returns the batches sent."""
        batches = list(batches_of(job_id, node, now=now))
        for batch in batches:
            self._call(self._agent, "POST", "/api/v1/ingest", json=batch)
        return len(batches)

    def _pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            query = {**params, "limit": PAGE_LIMIT, **({"cursor": cursor} if cursor else {})}
            page = self._call(self._people, "GET", path, params=query)
            if not isinstance(page, dict):
                break
            items += [i for i in page.get("items") or [] if isinstance(i, dict)]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return items

    def outcome(self, job_id: str) -> Outcome:
        """The job's incidents (each in full, with findings) and decisions now."""
        incidents = []
        for item in self._pages("/api/v1/incidents", {"job": job_id}):
            detail = self._call(self._people, "GET", f"/api/v1/incidents/{item['id']}") if "id" in item else None
            incidents.append(detail if isinstance(detail, dict) else item)
        decisions = self._pages("/api/v1/decisions", {"job": job_id})
        return Outcome(job_id, incidents=incidents, decisions=decisions)

    def diagnosed_at(self, job_id: str) -> tuple[bool, str | None]:
        """(whether the service tells it, when the job's last full diagnosis pass ran)."""
        job = self._call(self._people, "GET", f"/api/v1/jobs/{job_id}")
        if not isinstance(job, dict) or "diagnosed_at" not in job:
            return False, None  # an older service: the quiet outcome alone says it settled
        return True, job["diagnosed_at"]

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float = 90.0,
        min_wait_s: float = MIN_WAIT_S,
        quiet_s: float = QUIET_S,
        poll_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Outcome:
        """Read the outcome until a whole diagnosis pass has read what was sent, `min_wait_s` have passed and the
        outcome has not changed for `quiet_s`, or until `timeout_s`.

        Call it once everything is sent. A pass under way then may have begun before the last batch came; the one
        after it began after, since a job's full passes run one at a time: two new `diagnosed_at` values. Without
        them a busy service's outcome looks quiet before its worker got to the job (the corpus eval on a loaded
        machine scored logs it had not diagnosed yet)."""
        started = time.monotonic()
        told, before = self.diagnosed_at(job_id)
        passes: set[str] = set()
        last_key: object = None
        changed_at = started
        while True:
            # Before the outcome: what a pass decided is committed with its mark, so the outcome read next shows it.
            if told and len(passes) < 2 and (mark := self.diagnosed_at(job_id)[1]) and mark != before:
                passes.add(mark)
            outcome = self.outcome(job_id)
            now = time.monotonic()
            key = _fingerprint(outcome)
            if key != last_key:
                last_key, changed_at = key, now
            waited = now - started
            if waited >= min_wait_s and now - changed_at >= quiet_s and (not told or len(passes) >= 2):
                outcome.waited_s, outcome.settled = waited, True
                return outcome
            if waited >= timeout_s:
                outcome.waited_s = waited
                return outcome
            sleep(poll_s)


def _fingerprint(outcome: Outcome) -> tuple[Any, ...]:
    incidents = tuple(
        (i.get("id"), i.get("state"), i.get("root_cause"), i.get("blame"), len(i.get("findings") or []))
        for i in outcome.incidents
    )
    decisions = tuple((d.get("id"), d.get("kind"), d.get("state")) for d in outcome.decisions)
    return incidents, decisions


def rank_map(nodes: Sequence[NodeReplay]) -> list[dict[str, Any]]:
    """Each rank a node's events name, on that node (the first node to name it); a node naming none gets the
    next free rank, so every node is the job's."""
    owner: dict[int, str] = {}
    for node in nodes:
        for event in node.events:
            if event.rank is not None and event.rank not in owner:
                owner[event.rank] = node.node
    for node in nodes:
        if node.node not in owner.values():
            owner[next(r for r in range(len(owner) + 1) if r not in owner)] = node.node
    return [{"rank": r, "node": n} for r, n in sorted(owner.items())]


def batches_of(job_id: str, node: NodeReplay, *, now: datetime) -> list[dict[str, Any]]:
    """A node's replay as agent batches of at most BATCH_ITEMS events; the first carries the heartbeat (with the
    GPU inventory of a dcgm-exporter scrape, when one was given) and the scrape's readings as one sample."""
    stamp = now.astimezone(UTC)
    heartbeat: dict[str, Any] = {"agent_version": AGENT_VERSION, "jobs": [job_id]}
    if node.readings:
        heartbeat["gpus"] = [r.inventory() for r in node.readings]
    sample_at = (stamp - timedelta(seconds=1)).isoformat()
    metrics = [{"ts": sample_at, "gpu": r.gpu, "fields": r.fields} for r in node.readings]
    logs = [e.to_wire() for e in node.events]
    out = []
    for start in range(0, max(len(logs), 1), BATCH_ITEMS):
        batch: dict[str, Any] = {
            "batch_id": str(uuid.uuid4()),
            "node": node.node,
            "sent_at": stamp.isoformat(),
            "job_id": job_id,
            "logs": logs[start : start + BATCH_ITEMS],
        }
        if start == 0:
            batch["heartbeat"] = heartbeat
            batch["metrics"] = metrics
        out.append(batch)
    return out
