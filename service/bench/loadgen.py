"""The ingest benchmark's load generator, run as its own process: `python -m service.bench.loadgen`.

It shares a small machine with the API, the worker and PostgreSQL, so it must cost little CPU: request
bodies are rendered from per-node templates (only the batch id and the timestamps change per send) and
sent as pre-built HTTP/1.1 bytes on keep-alive connections (a bare asyncio protocol), reading back only
the status line and the Content-Length. An HTTP client library would spend more CPU per request than the
server it measures.

Protocol: a JSON LoadConfig on stdin; JSON lines on stdout, events (`{"event": "paced_start"}`) while
it runs and `{"result": {...}}` at the end; progress lines for people on stderr.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from service.synthetic import PROCESS_EVERY, SyntheticNode, make_nodes

# Bodies per node: a first one carrying the GPU inventory, as a starting agent sends, then a cycle of
# PROCESS_EVERY that rotate, so stored values vary and process snapshots come as often as an agent's.
TEMPLATE_VARIANTS = PROCESS_EVERY
PROGRESS_EVERY_S = 5.0
# How long the paced phase keeps sending queued requests after the last one was due.
PACED_GRACE_S = 10.0
# A request unanswered this long means a hung server: the phase ends without it.
HUNG_REQUEST_S = 60.0
DISPATCH_TICK_S = 0.001


@dataclass(frozen=True)
class LoadConfig:
    host: str
    port: int
    token: str
    nodes: int
    gpus_per_node: int
    interval: float
    duration: float
    connections: int
    capacity_seconds: float
    job_id: str
    node_prefix: str


@dataclass
class PhaseStats:
    """What one phase saw. Latency counts from the scheduled send time (queueing included); service
    time from the moment the request was written."""

    name: str
    samples_per_request: int
    sent: int = 0
    ok: int = 0
    errors: int = 0
    unsent: int = 0
    elapsed_s: float = 0.0
    last_done: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    latency: array[float] = field(default_factory=lambda: array("d"))
    service: array[float] = field(default_factory=lambda: array("d"))
    problems: list[str] = field(default_factory=list)

    def record(self, status: int, latency: float, service: float, body: bytes) -> None:
        self.statuses[status] += 1
        self.latency.append(latency)
        self.service.append(service)
        if 200 <= status < 300:
            self.ok += 1
        elif len(self.problems) < 5:
            self.problems.append(f"HTTP {status}: {body[:300].decode(errors='replace')}")

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        if len(self.problems) < 5:
            self.problems.append(f"{type(exc).__name__}: {exc}")

    def summary(self) -> dict[str, Any]:
        elapsed = self.elapsed_s or float("nan")
        return {
            "requests_sent": self.sent,
            "requests_ok": self.ok,
            "non_2xx": sum(n for status, n in self.statuses.items() if not 200 <= status < 300),
            "errors": self.errors,
            "unsent": self.unsent,
            # cut off by the hung-server timeout: the server may or may not have stored them
            "unanswered": self.sent - len(self.latency) - self.errors,
            "statuses": {str(status): n for status, n in sorted(self.statuses.items())},
            "ok_samples": self.ok * self.samples_per_request,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests_per_s": self.ok / elapsed,
            "samples_per_s": self.ok * self.samples_per_request / elapsed,
            "latency_ms": percentiles(self.latency),
            "service_ms": percentiles(self.service),
            "problems": self.problems,
        }


def percentiles(values: array[float] | list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    last = len(ordered) - 1
    return {
        "p50": round(ordered[round(0.50 * last)] * 1000, 2),
        "p99": round(ordered[round(0.99 * last)] * 1000, 2),
        "max": round(ordered[-1] * 1000, 2),
    }


@dataclass(frozen=True)
class _Template:
    head: bytes  # up to the batch id
    tail: list[bytes]  # the rest, split at each timestamp

    @classmethod
    def of(cls, batch: dict[str, Any]) -> _Template:
        body = orjson.dumps(batch)
        batch_id = batch["batch_id"].encode()
        ts = batch["sent_at"].encode()
        if body.count(batch_id) != 1 or ts in body.split(batch_id)[0]:
            raise ValueError("batch id must come first in a batch and appear once")
        head, rest = body.split(batch_id)
        return cls(head, rest.split(ts))

    def render(self, batch_id: bytes, ts: bytes) -> bytes:
        return b"".join((self.head, batch_id, ts.join(self.tail)))


def _batch_ids() -> Iterator[bytes]:
    """Unique UUIDs (version 4 layout): a random per-run prefix and a counter, cheaper than uuid4()."""
    prefix = uuid.uuid4().hex[:20]
    for n in itertools.count():
        yield f"{prefix[:8]}-{prefix[8:12]}-4{prefix[13:16]}-a{prefix[17:20]}-{n:012x}".encode()


_BATCH_IDS = _batch_ids()


class NodeBodies:
    """One node's request bodies: agent-shaped, a fresh batch id and timestamps for every send."""

    def __init__(self, node: SyntheticNode, interval: float) -> None:
        self.first = _Template.of(node.batch(interval=interval))
        self.rotating = [_Template.of(node.batch(interval=interval)) for _ in range(TEMPLATE_VARIANTS)]
        self.sends = 0

    def next_body(self) -> bytes:
        template = self.first if self.sends == 0 else self.rotating[self.sends % TEMPLATE_VARIANTS]
        self.sends += 1
        return template.render(next(_BATCH_IDS), datetime.now(UTC).isoformat().encode())


class _ResponseReader(asyncio.Protocol):
    """Collects one HTTP/1.1 response at a time: status, Content-Length body, whether the server closes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buffer[: end + 2]).lower()
        at = head.find(b"\r\ncontent-length:")
        length = int(head[at + 17 : head.index(b"\r\n", at + 2)]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        self.closing = b"\r\nconnection: close" in head
        if not self.waiter.done():
            self.waiter.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError("the server closed the connection"))


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time; reopened after an error or a
    `Connection: close`. A protocol, not streams: fewer wake-ups per request for the same bytes."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.protocol: _ResponseReader | None = None

    async def request(self, payload: bytes) -> tuple[int, bytes]:
        if self.protocol is None or self.protocol.closing:
            self.close()
            _, self.protocol = await asyncio.get_running_loop().create_connection(_ResponseReader, self.host, self.port)
        protocol = self.protocol
        assert protocol.transport is not None
        protocol.waiter = asyncio.get_running_loop().create_future()
        # One request of a few KiB at a time: the transport buffer never needs flow control.
        protocol.transport.write(payload)
        return await protocol.waiter

    def close(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.close()
        self.protocol = None


class LoadGenerator:
    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        cluster = make_nodes(config.nodes, gpus=config.gpus_per_node, job_id=config.job_id, prefix=config.node_prefix)
        self.bodies = [NodeBodies(node, config.interval) for node in cluster]
        self.request_head = (
            f"POST /api/v1/ingest HTTP/1.1\r\nHost: {config.host}:{config.port}\r\n"
            f"Authorization: Bearer {config.token}\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        self.connections = [Connection(config.host, config.port) for _ in range(config.connections)]

    async def send(self, conn: Connection, node: int, stats: PhaseStats, due: float) -> None:
        loop = asyncio.get_running_loop()
        body = self.bodies[node].next_body()
        payload = b"".join((self.request_head, str(len(body)).encode(), b"\r\n\r\n", body))
        stats.sent += 1
        started = loop.time()
        try:
            status, answer = await conn.request(payload)
        except (OSError, ValueError) as exc:
            conn.close()
            stats.failed(exc)
            return
        done = loop.time()
        stats.last_done = done
        stats.record(status, done - due, done - started, answer)

    async def warmup(self) -> PhaseStats:
        """Each node's first batch (GPU inventory, new node, new ranks), so the paced phase is steady state."""
        stats = self._stats("warmup")
        nodes = iter(range(self.config.nodes))
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def worker(conn: Connection) -> None:
            for node in nodes:
                await self.send(conn, node, stats, loop.time())

        # Even a server answering only 10 requests a second gets through the warm-up.
        await self._run_workers(worker, timeout=HUNG_REQUEST_S + self.config.nodes / 10)
        stats.elapsed_s = loop.time() - started
        return stats

    async def paced(self) -> PhaseStats:
        """Open loop: node i sends at t0 + i*interval/N + k*interval, whether or not the server keeps up."""
        cfg = self.config
        stats = self._stats("paced")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        total = int(cfg.nodes * cfg.duration / cfg.interval)
        spacing = cfg.interval / cfg.nodes
        t0 = loop.time() + 0.05

        async def dispatch() -> None:
            k = 0
            while k < total:
                now = loop.time()
                while k < total and t0 + k * spacing <= now:
                    queue.put_nowait((k % cfg.nodes, t0 + k * spacing))
                    k += 1
                await asyncio.sleep(max(DISPATCH_TICK_S, t0 + k * spacing - loop.time()))
            for _ in self.connections:
                queue.put_nowait(None)

        give_up_at = t0 + cfg.duration + PACED_GRACE_S

        async def worker(conn: Connection) -> None:
            while (item := await queue.get()) is not None:
                # Past the grace period the rest of the queue is dropped, but requests already
                # sent are waited for, so that every stored row has its answer.
                if loop.time() < give_up_at:
                    await self.send(conn, item[0], stats, item[1])

        progress = asyncio.create_task(self._progress(stats, t0, queue))
        dispatcher = asyncio.create_task(dispatch())
        await self._run_workers(worker, timeout=give_up_at + HUNG_REQUEST_S - loop.time())
        dispatcher.cancel()
        progress.cancel()
        stats.unsent = total - stats.sent
        if stats.unsent:
            print(
                f"[bench] paced: dropped {stats.unsent} requests still queued {PACED_GRACE_S:g} s "
                "after the last one was due",
                file=sys.stderr,
                flush=True,
            )
        # Falling behind stretches the phase past its duration, and so lowers the sustained rate.
        stats.elapsed_s = max(cfg.duration, stats.last_done - t0)
        return stats

    async def capacity(self) -> PhaseStats:
        """Closed loop: every connection sends its next batch as soon as the previous is answered."""
        stats = self._stats("capacity")
        loop = asyncio.get_running_loop()
        started = loop.time()
        end = started + self.config.capacity_seconds
        order = itertools.count()

        async def worker(conn: Connection) -> None:
            while loop.time() < end:
                await self.send(conn, next(order) % self.config.nodes, stats, loop.time())

        progress = asyncio.create_task(self._progress(stats, started, None))
        await self._run_workers(worker, timeout=self.config.capacity_seconds + HUNG_REQUEST_S)
        progress.cancel()
        stats.elapsed_s = loop.time() - started
        return stats

    def _stats(self, name: str) -> PhaseStats:
        return PhaseStats(name=name, samples_per_request=self.config.gpus_per_node)

    async def _run_workers(self, worker: Callable[[Connection], Awaitable[None]], timeout: float) -> None:
        """One worker task per connection; any still running after `timeout` (a hung server) are cancelled."""
        tasks = {asyncio.create_task(worker(conn)): conn for conn in self.connections}
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            # A cancelled request leaves its connection mid-exchange: start those afresh.
            for task in pending:
                tasks[task].close()

    async def _progress(self, stats: PhaseStats, t0: float, queue: asyncio.Queue[Any] | None) -> None:
        loop = asyncio.get_running_loop()
        seen = 0
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            window = stats.latency[seen:]
            seen = len(stats.latency)
            p99 = percentiles(window)["p99"]
            waiting = f", queued {queue.qsize()}" if queue is not None else ""
            print(
                f"[bench] {stats.name} {loop.time() - t0:5.1f} s: sent {stats.sent}, ok {stats.ok}, "
                f"non-2xx {seen - stats.ok}, errors {stats.errors}{waiting}, "
                f"p99 (last {PROGRESS_EVERY_S:.0f} s) {p99} ms",
                file=sys.stderr,
                flush=True,
            )


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _run(config: LoadConfig) -> dict[str, Any]:
    started = time.perf_counter()
    generator = LoadGenerator(config)
    print(
        f"[bench] load generator: built bodies for {config.nodes} nodes in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    results: dict[str, Any] = {}
    results["warmup"] = (await generator.warmup()).summary()
    for name, phase in (("paced", generator.paced), ("capacity", generator.capacity)):
        _emit({"event": f"{name}_start"})
        results[name] = (await phase()).summary()
        _emit({"event": f"{name}_end"})
    for conn in generator.connections:
        conn.close()
    return results


def main() -> None:
    config = LoadConfig(**json.loads(sys.stdin.read()))
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        _emit({"result": runner(_run(config))})
    except KeyboardInterrupt:
        sys.exit(130)


def config_json(config: LoadConfig) -> str:
    return json.dumps(asdict(config))


if __name__ == "__main__":
    main()
