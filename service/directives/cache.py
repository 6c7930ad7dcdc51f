"""Active directives for the ingest fast path: one query per API process per second, not per batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.checks.service import active_by_node
from service.directives.service import active_by_job


class DirectiveCache:
    def __init__(self, factory: sessionmaker[Session], *, max_age: float = 1.0) -> None:
        self.factory = factory
        self.max_age = max_age
        self._by_job: dict[str, list[dict[str, Any]]] = {}
        self._by_node: dict[str, list[dict[str, Any]]] = {}
        self._loaded_at = float("-inf")
        self._lock = asyncio.Lock()

    def _load(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
        with self.factory() as session:
            return active_by_job(session), active_by_node(session)

    async def _refresh(self) -> None:
        if time.monotonic() - self._loaded_at > self.max_age:
            async with self._lock:  # one refresh at a time; the others wait for it, then use it
                if time.monotonic() - self._loaded_at > self.max_age:
                    self._by_job, self._by_node = await run_in_threadpool(self._load)
                    self._loaded_at = time.monotonic()

    async def for_jobs(self, job_ids: Iterable[str | None]) -> list[dict[str, Any]]:
        await self._refresh()
        by_job = self._by_job
        if not by_job:
            return []
        return [d for job_id in dict.fromkeys(job_ids) if job_id for d in by_job.get(job_id, ())]

    async def for_batch(self, *, node: str, job_ids: Iterable[str | None]) -> list[dict[str, Any]]:
        """The directives of the node's jobs, then those addressed to the node itself (run_checks)."""
        by_jobs = await self.for_jobs(job_ids)
        return by_jobs + list(self._by_node.get(node, ()))
