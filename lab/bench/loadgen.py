"""The load generator of `faultline bench ingest` and `faultline bench scale-eval`, run as its own process:
`python -m lab.bench.loadgen`.

It shares a small machine with the API, the worker and PostgreSQL, so it must cost little CPU: request
bodies are rendered from per-node templates (only the batch id, the sample timestamps and the step lines
change per send) and sent as pre-built HTTP/1.1 bytes on keep-alive connections (a bare asyncio protocol),
reading back only the status line and the Content-Length. An HTTP client library would spend more CPU per
request than the server it measures.

Agents sample GPU counters every `sample_interval` and ship every `ship_interval`, so one batch carries
ship/sample samples per GPU, each with its own timestamp. A scale eval also injects one fault on one node
(`fault`): a thermally throttled GPU (its node's templates switch, and every step of the job gets slower),
or a fatal Xid 79 line sent at once, as an agent sends a critical event (the GPU's series then stop).

Protocol: a JSON LoadConfig on stdin; JSON lines on stdout, events (`{"event": "paced_start"}`,
`{"event": "injected", ...}`) while it runs and `{"result": {...}}` at the end; progress lines for people
on stderr. SIGTERM ends the paced phase early and still reports.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from lab.bench.loadgen_bodies import NodeBodies
from lab.bench.loadgen_protocol import LoadConfig, PhaseStats, percentiles
from lab.bench.synthetic import make_nodes, step_log, xid_log
from lab.sim.gpu import COMPUTE_SHARE, THROTTLE_RATIO

# How long the paced phase keeps sending queued requests after the last one was due.
PACED_GRACE_S = 10.0
# A request unanswered this long means a hung server: the phase ends without it.
HUNG_REQUEST_S = 60.0
DISPATCH_TICK_S = 0.001
# A throttled GPU computes at its reduced clock and every rank waits for it (lab/sim/model.py).
STRAGGLER_SLOWDOWN = COMPUTE_SHARE / THROTTLE_RATIO + (1 - COMPUTE_SHARE)
FAULTS = ("xid", "straggler")


class StepClock:
    """The job's training steps on the wall clock: step k ends at a known time; a straggler stretches
    every step after its onset."""

    def __init__(self, *, step_s: float, first_step: int, t0: float) -> None:
        self.step_s = step_s
        self._anchor_t = t0
        self._anchor_step = float(first_step)

    def position(self, t: float) -> float:
        return self._anchor_step + (t - self._anchor_t) / self.step_s

    def slow_down(self, t: float, factor: float) -> None:
        self._anchor_step = self.position(t)
        self._anchor_t = t
        self.step_s *= factor

    def completed(self, after: float, until: float) -> list[tuple[int, float]]:
        """(step, end time) of the steps that ended in (after, until]."""
        first, last = math.floor(self.position(after)) + 1, math.floor(self.position(until))
        return [(k, self._anchor_t + (k - self._anchor_step) * self.step_s) for k in range(first, last + 1)]


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
        if config.fault is not None and config.fault not in FAULTS:
            raise ValueError(f"unknown fault {config.fault!r}; known: {', '.join(FAULTS)}")
        self.config = config
        start = datetime.now(UTC)
        cluster = make_nodes(config.nodes, gpus=config.gpus_per_node, job_id=config.job_id, prefix=config.node_prefix)
        self.names = [node.name for node in cluster]
        self.bodies = [NodeBodies(node, config, start=start) for node in cluster]
        self.fault_bodies: NodeBodies | None = None
        if config.fault is not None:
            # The faulty node's bodies from the injection on, built now: no CPU spike at the worst moment.
            faulty = make_nodes(config.nodes, gpus=config.gpus_per_node, job_id=config.job_id,
                                prefix=config.node_prefix)[config.fault_node]  # fmt: skip
            (faulty.throttled if config.fault == "straggler" else faulty.lost).add(config.fault_gpu)
            faulty.batches = 1  # no GPU inventory: the node has long announced it
            self.fault_bodies = NodeBodies(faulty, config, start=start)
        self.clock = StepClock(step_s=config.step_s, first_step=10_000, t0=time.time())
        self.logged_until: dict[int, float] = {}
        self.request_head = (
            f"POST /api/v1/ingest HTTP/1.1\r\nHost: {config.host}:{config.port}\r\n"
            f"Authorization: Bearer {config.token}\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        self.connections = [Connection(config.host, config.port) for _ in range(config.connections)]
        self.stopping = False
        self.injection: dict[str, Any] | None = None

    def stop(self) -> None:
        """End the current phase early (SIGTERM): nothing more is sent, what was sent is waited for."""
        self.stopping = True

    def body(self, node: int) -> bytes:
        now = time.time()
        return self.bodies[node].next_body(now, self._step_lines(node, now))

    def _step_lines(self, node: int, now: float) -> bytes:
        """The step lines the node's first rank logged since its last batch (the logging nodes only)."""
        if node >= self.config.step_log_nodes:
            return b"[]"
        after = self.logged_until.get(node, now - self.config.ship_interval)
        self.logged_until[node] = now
        rank = node * self.config.gpus_per_node
        step_s = self.clock.step_s
        return orjson.dumps(
            [
                step_log(ts=datetime.fromtimestamp(t, UTC), step=k, rank=rank, step_s=step_s)
                for k, t in self.clock.completed(after, now)
            ]
        )

    async def send(self, conn: Connection, node: int, stats: PhaseStats, due: float) -> None:
        await self._post(conn, self.body(node), stats, due)

    async def _post(self, conn: Connection, body: bytes, stats: PhaseStats, due: float) -> None:
        loop = asyncio.get_running_loop()
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
                if self.stopping:
                    return
                await self.send(conn, node, stats, loop.time())

        # Even a server answering only 10 requests a second gets through the warm-up.
        await self._run_workers(worker, timeout=HUNG_REQUEST_S + self.config.nodes / 10)
        stats.elapsed_s = loop.time() - started
        return stats

    async def paced(self) -> PhaseStats:
        """Open loop: node i ships at t0 + i*ship/N + k*ship, whether or not the server keeps up."""
        cfg = self.config
        stats = self._stats("paced")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        total = stats.scheduled = int(cfg.nodes * cfg.duration / cfg.ship_interval)
        spacing = cfg.ship_interval / cfg.nodes
        t0 = loop.time() + 0.05

        async def dispatch() -> None:
            k = 0
            while k < total and not self.stopping:
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
                # Past the grace period (or once stopped) the rest of the queue is dropped, but requests
                # already sent are waited for, so that every stored row has its answer.
                if loop.time() < give_up_at and not self.stopping:
                    await self.send(conn, item[0], stats, item[1])

        progress = asyncio.create_task(self._progress(stats, t0, queue))
        dispatcher = asyncio.create_task(dispatch())
        injector = None
        if cfg.fault is not None and cfg.fault_after < cfg.duration:
            injector = asyncio.create_task(self._inject_at(t0 + cfg.fault_after, stats))
        await self._run_workers(worker, timeout=give_up_at + HUNG_REQUEST_S - loop.time())
        for task in (dispatcher, progress, injector):
            if task is not None:
                task.cancel()
        if self.stopping:
            stats.stopped_early = True
            stats.elapsed_s = max(1e-3, min(cfg.duration, loop.time() - t0))
            return stats
        stats.unsent = total - stats.sent
        if stats.unsent:
            _say(f"paced: dropped {stats.unsent} requests still queued {PACED_GRACE_S:g} s after the last one was due")
        # Falling behind stretches the phase past its duration, and so lowers the sustained rate.
        stats.elapsed_s = max(cfg.duration, stats.last_done - t0)
        return stats

    async def _inject_at(self, when: float, stats: PhaseStats) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, when - loop.time()))
        if not self.stopping:
            await self.inject(stats)

    async def inject(self, stats: PhaseStats) -> None:
        """The fault, now: a straggler starts throttling; an Xid line goes out at once, on its own connection
        (an agent sends critical events without waiting for the interval), then the GPU's series stop."""
        cfg = self.config
        assert self.fault_bodies is not None
        node, name = cfg.fault_node, self.names[cfg.fault_node]
        now = time.time()
        at = datetime.fromtimestamp(now, UTC)
        self.bodies[node] = self.fault_bodies.take_over(self.bodies[node])
        event: dict[str, Any] = {"event": "injected", "fault": cfg.fault, "node": name, "gpu": cfg.fault_gpu}
        if cfg.fault == "straggler":
            self.clock.slow_down(now, STRAGGLER_SLOWDOWN)
        else:
            batch = {
                "batch_id": str(uuid.uuid4()),
                "node": name,
                "sent_at": at.isoformat(),
                "job_id": cfg.job_id,
                "logs": [xid_log(ts=at, node=name, gpu=cfg.fault_gpu)],
            }
            conn = Connection(cfg.host, cfg.port)
            critical = self._stats("critical")  # counted on its own, not in the paced phase
            await self._post(conn, orjson.dumps(batch), critical, asyncio.get_running_loop().time())
            conn.close()
            critical.elapsed_s = time.time() - now
            event["request"] = critical.summary()
        self.injection = event | {"at": at.isoformat()}
        _emit(self.injection)
        _say(f"injected {cfg.fault} on {name} GPU {cfg.fault_gpu} at {at:%H:%M:%S.%f}"[:-3])

    async def capacity(self) -> PhaseStats:
        """Closed loop: every connection sends its next batch as soon as the previous is answered."""
        stats = self._stats("capacity")
        loop = asyncio.get_running_loop()
        started = loop.time()
        end = started + self.config.capacity_seconds
        order = itertools.count()

        async def worker(conn: Connection) -> None:
            while loop.time() < end and not self.stopping:
                await self.send(conn, next(order) % self.config.nodes, stats, loop.time())

        progress = asyncio.create_task(self._progress(stats, started, None))
        await self._run_workers(worker, timeout=self.config.capacity_seconds + HUNG_REQUEST_S)
        progress.cancel()
        stats.elapsed_s = loop.time() - started
        return stats

    def _stats(self, name: str) -> PhaseStats:
        return PhaseStats(name=name, samples_per_request=self.config.gpus_per_node * self.config.samples_per_batch)

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
        every = self.config.progress_s
        while True:
            await asyncio.sleep(every)
            window = stats.latency[seen:]
            seen = len(stats.latency)
            p99 = percentiles(window)["p99"]
            waiting = f", queued {queue.qsize()}" if queue is not None else ""
            directives = f", directives {stats.directives}" if stats.directives else ""
            _say(
                f"{stats.name} {loop.time() - t0:5.1f} s: sent {stats.sent}, ok {stats.ok}, "
                f"non-2xx {seen - stats.ok}, errors {stats.errors}{waiting}{directives}, "
                f"p99 (last {every:.0f} s) {p99} ms"
            )


def _say(message: str) -> None:
    print(f"[loadgen] {message}", file=sys.stderr, flush=True)


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _run(config: LoadConfig) -> dict[str, Any]:
    started = time.perf_counter()
    generator = LoadGenerator(config)
    _say(
        f"built bodies for {config.nodes} nodes ({config.samples_per_batch} samples per GPU per batch) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, generator.stop)
    results: dict[str, Any] = {}
    results["warmup"] = (await generator.warmup()).summary()
    phases: list[tuple[str, Callable[[], Awaitable[PhaseStats]]]] = [("paced", generator.paced)]
    if config.capacity_seconds > 0:
        phases.append(("capacity", generator.capacity))
    for name, phase in phases:
        _emit({"event": f"{name}_start"})
        results[name] = (await phase()).summary()
        _emit({"event": f"{name}_end"})
    for conn in generator.connections:
        conn.close()
    results["injection"] = generator.injection
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


if __name__ == "__main__":
    main()
