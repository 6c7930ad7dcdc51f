"""Long polls wake when a decision is written: PostgreSQL LISTEN on the channel a trigger notifies.

One listening connection per API process, opened on the first long poll. If it is lost, waiters still look
again every few seconds, so a missed notification delays an answer, never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg

from service.config import to_libpq_url

log = logging.getLogger(__name__)

CHANNEL = "faultline_decisions"
# How often a waiter looks again on its own: often when no notification can reach it, rarely otherwise.
RECHECK_LISTENING_S = 5.0
RECHECK_BLIND_S = 1.0


class DecisionWaiter:
    def __init__(self, database_url: str) -> None:
        self._url = to_libpq_url(database_url)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.listening = False

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        backoff = 1.0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening, backoff = True, 1.0
                    async for _ in conn.notifies():
                        self._wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.listening:
                    log.warning(
                        "decision notifications lost (%s); long polls recheck every %.0f s", exc, RECHECK_BLIND_S
                    )
            self.listening = False
            self._wake()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    def _wake(self) -> None:
        # Wake everyone waiting now; later waiters wait for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def arm(self) -> asyncio.Event:
        """Take this before looking in the database: a change from then on sets the event, so none is missed."""
        self._start()
        return self._changed

    async def wait(self, armed: asyncio.Event, timeout: float) -> None:
        """Return when a decision changed since `arm`, or after `timeout`, or after a recheck interval."""
        recheck = RECHECK_LISTENING_S if self.listening else RECHECK_BLIND_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(armed.wait(), timeout=min(timeout, recheck))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
