"""Group commit for ingest: batches that arrive together are written in one transaction.

A request is answered only after its batch is committed (or has failed), so an agent never
drops data the service did not store. A flush that fails for one bad batch is retried batch by
batch, so one agent's bad data cannot fail another's request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time

import psycopg
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.errors import InvalidInput, ServiceUnavailable
from service.ingest import service
from service.ingest.schemas import IngestBatch
from service.ingest.service import BatchOutcome, UpsertCache
from service.observability import INGEST_FLUSH_SECONDS, INGEST_FLUSH_SIZE

log = logging.getLogger(__name__)

_Item = tuple[IngestBatch, "asyncio.Future[BatchOutcome]"]
_Answer = tuple["asyncio.Future[BatchOutcome]", BatchOutcome | BaseException]
_STOP = object()


def _is_connection_problem(exc: BaseException) -> bool:
    # COPY runs on the raw psycopg connection, so its errors arrive unwrapped.
    if isinstance(exc, OperationalError | psycopg.OperationalError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


class IngestWriter:
    def __init__(self, factory: sessionmaker[Session], *, max_batches: int, max_wait_ms: float) -> None:
        self._factory = factory
        self._max_batches = max_batches
        self._max_wait = max_wait_ms / 1000
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._cache = UpsertCache()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued, then stop."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=30)
            self._thread = None

    async def submit(self, batch: IngestBatch) -> BatchOutcome:
        future: asyncio.Future[BatchOutcome] = asyncio.get_running_loop().create_future()
        self._queue.put((batch, future))
        return await future

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            items: list[_Item] = [first]  # type: ignore[list-item]
            # Under load, batches pile up while the previous flush runs, so flushes grow by themselves;
            # an optional wait trades latency for even larger groups.
            deadline = time.monotonic() + self._max_wait
            while len(items) < self._max_batches:
                timeout = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                items.append(item)  # type: ignore[arg-type]
            answers: list[_Answer] = []
            try:
                self._flush(items, answers)
            except Exception as exc:  # the writer must outlive any one flush, or ingest stops for good
                log.exception("ingest writer failed a flush")
                answers = [(future, exc) for _, future in items]
            _deliver(answers)

    def _flush(self, items: list[_Item], answers: list[_Answer]) -> None:
        # A request whose client went away before its flush is not written (it was never answered).
        items = [item for item in items if not item[1].cancelled()]
        if not items:
            return
        started = time.perf_counter()
        try:
            outcomes = self._write([batch for batch, _ in items])
        except Exception as exc:
            if _is_connection_problem(exc) or len(items) == 1:
                answers.extend((future, self._as_error(exc)) for _, future in items)
                return
            log.warning("group flush of %d batches failed (%s); retrying one by one", len(items), exc)
            for item in items:
                self._flush([item], answers)
            return
        finally:
            INGEST_FLUSH_SECONDS.observe(time.perf_counter() - started)
            INGEST_FLUSH_SIZE.observe(len(items))
        answers.extend((future, outcome) for (_, future), outcome in zip(items, outcomes, strict=True))

    def _write(self, batches: list[IngestBatch]) -> list[BatchOutcome]:
        try:
            with session_scope(self._factory) as session:
                outcomes = service.store_batches(session, batches=batches, cache=self._cache)
        except BaseException:
            self._cache.rollback()
            raise
        self._cache.commit()
        return outcomes

    @staticmethod
    def _as_error(exc: Exception) -> Exception:
        if _is_connection_problem(exc):
            log.warning("database unavailable during ingest: %s", exc)
            return ServiceUnavailable("database unavailable; retry later")
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, psycopg.DataError):
            # The database refused a value (a NUL byte, a number out of range): the batch is bad.
            return InvalidInput(f"batch rejected by the database: {str(orig).splitlines()[0]}")
        log.error("ingest flush failed", exc_info=exc)
        return exc


def _deliver(answers: list[_Answer]) -> None:
    """Hand results to the event loop(s): one wake-up per flush, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Answer]] = {}
    for future, answer in answers:
        by_loop.setdefault(future.get_loop(), []).append((future, answer))
    for loop, group in by_loop.items():
        # RuntimeError: the loop has closed, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, group)


def _settle(answers: list[_Answer]) -> None:
    for future, answer in answers:
        if future.done():
            continue
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
