"""The node agent's loop: collect, batch, spool, ship; act on the service's directives.

GPU counters are sampled every sample interval (1 s by default) and shipped every ship interval (5 s):
one batch carries every sample since the one before, each with its own time, so a cluster makes a fifth
of the requests without coarser data. Logs are polled several times a second, and a critical event (a
fatal Xid, a crash, a traceback, an NCCL error) or a stack dump is shipped at once with whatever was
gathered so far, instead of waiting for the ship tick. Training processes are scanned every few seconds
(they change slowly).
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import orjson

from agents import bundle as bundles
from agents.bundle_upload import upload
from agents.checks.collectives import Peer
from agents.checks.suite import Options, Refused, run_suite
from agents.cloud_events import CloudEventPoller, reporter
from agents.config import AgentConfig
from agents.events import Event
from agents.follow import GlobFollower, LineSource, Position, open_kernel_log
from agents.gpu import DcgmExporter, GpuReading, GpuSource
from agents.history import RecentBatches
from agents.node import NodeCollectors
from agents.nvml import Nvml, open_nvml
from agents.nvml_fabric import WithFabric, open_exporter_fabric
from agents.nvml_xid import NvmlXids, open_nvml_xids
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training import DEFAULT_STEP_PATTERNS, TrainingLogParser
from agents.port_watch import PortWatch
from agents.procs import ProcessScanner, Worker
from agents.samples import SampleBuffer, left_over
from agents.shipper import Shipper
from agents.spool import KINDS, Spool
from agents.stacks import dump_all

log = logging.getLogger("faultline.agent")

TICK = 0.2  # seconds between log polls
# A tick this close is due now: sample and ship ticks that coincide (5 x 1 s, 1 x 5 s) must not drift apart
# by a rounding error and put the last sample of a batch into the next one.
TICK_SLACK = 0.001
# Ship early when a batch holds this many GPU samples (the service takes up to 100,000 per batch).
MAX_BATCH_METRICS = 50_000
IDLE_FLUSH = 1.0  # a multi-line block (traceback) with no new line for this long is complete
EXIT_AUTH = 3
# SIGTERM to exit: what is not acknowledged by then stays in the spool for the next start. A node being
# drained must not wait on a service that is gone, and systemd or Kubernetes kill it soon after anyway.
SHUTDOWN_S = 1.0
# A job's log lines outlive its processes (the traceback of a crash is written as they die): events are
# attributed to a job seen on the node this recently; samples only while its processes run.
JOB_LINGER_S = 600.0
# --once reads the CPU counters twice this far apart, so a dry run prints real CPU percentages.
ONCE_CPU_SPAN_S = 0.3
# A metadata service answers in milliseconds; a node without one must not wait longer than this per provider.
CLOUD_PROBE_TIMEOUT_S = 1.0
BUNDLE_HISTORY_BYTES = 16 * 2**20  # the agent's last batches kept for bundles: at most this much memory

try:
    AGENT_VERSION = version("faultline")
except PackageNotFoundError:  # running from a source tree that was never installed
    AGENT_VERSION = "dev"


class _NoProcesses(ProcessScanner):
    """--no-processes: a scanner that finds none."""

    def scan(self, now: float) -> list[Worker]:
        return []


def _sample(ts: str, reading: GpuReading) -> dict[str, Any]:
    """One GPU's metric item; the exporter's workload labels ride along when it has them."""
    item: dict[str, Any] = {"ts": ts, "gpu": reading.gpu, "fields": reading.fields}
    if reading.workload:
        item["workload"] = reading.workload
    return item


def _boot_time() -> datetime | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), UTC)
    except OSError:
        pass
    return None


class _Stream:
    """One followed log and its own parser (multi-line state is per stream)."""

    def __init__(self, parser: KernelLogParser | TrainingLogParser) -> None:
        self.parser = parser
        self.last_line = 0.0
        self.pending = False


class _Ticker:
    """Due every `interval` seconds from `start`; after a stall (suspend, slow disk) the missed ticks are
    skipped rather than run in a burst."""

    def __init__(self, interval: float, start: float) -> None:
        self.interval = interval
        self.start = start
        self.count = 0
        self.due = start

    def fire(self, now: float) -> bool:
        if now + TICK_SLACK < self.due:
            return False
        # Computed from the start, not accumulated, so coinciding tickers stay exactly in step.
        self.count = max(self.count + 1, math.floor((now - self.start) / self.interval) + 1)
        self.due = self.start + self.count * self.interval
        return True


class Agent:
    def __init__(self, config: AgentConfig, *, out: TextIO | None = None) -> None:
        self.config = config
        self.out = out or sys.stdout
        self.started = time.monotonic()
        self.stopping = threading.Event()
        self.events: list[Event] = []
        self.stacks: queue.SimpleQueue[list[dict[str, Any]]] = queue.SimpleQueue()
        self.checks: queue.SimpleQueue[list[dict[str, Any]]] = queue.SimpleQueue()
        self._checking = threading.Lock()  # one suite at a time: two would measure each other
        self._bundling = threading.Lock()  # one evidence bundle at a time: a second waits for the first
        # The last minutes of shipped batches, for evidence bundles (a shipped batch leaves the spool).
        self.recent = RecentBatches(max_age_s=config.bundle_history_s, max_bytes=BUNDLE_HISTORY_BYTES)
        self.workers: list[Worker] = []
        self._jobs_seen: dict[str, float] = {}  # job id -> when its processes were last seen here
        self.inventory: list[dict[str, Any]] = []
        self._seen_directives: set[str] = set()
        self._streams: dict[str, _Stream] = {}
        from_start = config.from_start or config.once
        self.spool: Spool | None = None
        positions: dict[str, Position] = {}
        if not config.dry_run:
            self.spool = Spool(
                config.spool_path,
                max_bytes=int(config.spool_max_mb * 2**20),
                max_batches=config.spool_max_batches,
            )
            positions = self._load_positions()
        # GPU samples wait here for the ship tick, journaled beside the spool.
        self.samples = SampleBuffer(config.spool_path if self.spool is not None else None)
        self.kernel: LineSource | None = self._open_kernel(from_start, positions)
        self.logs = GlobFollower(config.logs, from_start=from_start, positions=positions)
        self.step_patterns = (*config.step_patterns, *DEFAULT_STEP_PATTERNS)
        self.scanner = ProcessScanner(job_env=config.job_env, watch_pid=config.watch_pid)
        if not config.processes:
            self.scanner = _NoProcesses()
        self._scan_lock = threading.Lock()  # the loop and a stack-dump thread both scan
        self.gpus: GpuSource | None = self._open_exporter() if config.dcgm_url else open_nvml()
        self.nvml_xids = self._open_nvml_xids()
        # Network ports, the host and the watched volumes: read once per ship tick, not every GPU sample.
        self.node = NodeCollectors(
            sysfs_root=config.sysfs_root,
            procfs_root=config.procfs_root,
            volumes=config.volumes,
            location=config.location,
            storage_mounts=config.mounts,
        )
        self.node.prime()
        self.port_watch = PortWatch()  # the ports' links between ship ticks: a port gone down ships at once
        self._primed = time.monotonic()
        self.node_metrics: list[dict[str, Any]] = []
        self.shipper: Shipper | None = None
        self._ship_thread: threading.Thread | None = None
        if self.spool is not None:
            assert config.server and config.token
            self.shipper = Shipper(
                self.spool, server=config.server, token=config.token, on_directives=self._on_directives
            )
            self._recover_samples()
        # Cloud scheduled events, reported to the service as maintenance windows (agents/cloud_events.py).
        self.cloud: CloudEventPoller | None = None
        if config.cloud_events != "off" and self.shipper is not None and not config.once:
            assert config.server and config.token
            self.cloud = CloudEventPoller(
                mode=config.cloud_events,
                interval=config.cloud_events_interval,
                timeout=CLOUD_PROBE_TIMEOUT_S,
                base_url=config.cloud_metadata_url,
                report=reporter(server=config.server, node=config.node_name, token=config.token),
            )

    # -- sources ---------------------------------------------------------------------------------

    def _open_kernel(self, from_start: bool, positions: dict[str, Position]) -> LineSource | None:
        spec = self.config.kmsg
        if spec == "none":
            return None
        if spec == "auto":
            try:
                return open_kernel_log("/dev/kmsg", from_start=from_start)
            except OSError as exc:
                log.info("not following the kernel log: /dev/kmsg is not readable (%s); use --kmsg", exc)
                return None
        try:
            return open_kernel_log(spec, from_start=from_start, position=positions.get(spec))
        except OSError as exc:
            log.warning("cannot follow the kernel log %s: %s", spec, exc)
            return None

    def _open_exporter(self) -> GpuSource:
        """dcgm-exporter for the counters; with NVML beside it for the GPUs' NVLink fabric info, which the exporter
        does not export (--nvml-fabric; on a node whose GPUs are in no multi-node NVLink fabric, NVML is let go)."""
        assert self.config.dcgm_url
        exporter = DcgmExporter(self.config.dcgm_url)
        fabric = open_exporter_fabric() if self.config.nvml_fabric == "auto" else None
        return exporter if fabric is None else WithFabric(exporter, fabric)

    def _open_nvml_xids(self) -> NvmlXids | None:
        """NVML's Xid events: by default when no kernel log is followed and NVML reads the GPUs (--nvml-xid)."""
        mode = self.config.nvml_xid
        nvml = self.gpus if isinstance(self.gpus, Nvml) else None
        if mode == "off" or self.config.once or (mode == "auto" and (self.kernel is not None or nvml is None)):
            return None  # `--once` reads what is there: events are only what happens while it waits
        xids = open_nvml_xids(nvml)
        if xids is not None:
            log.info("reading Xids from NVML events on %d GPUs", xids.watching)
            xids.start()
        elif mode == "on":
            log.warning("--nvml-xid on, but no GPU offers NVML Xid events (see above)")
        return xids

    def _stream(self, name: str, make: Callable[[], KernelLogParser | TrainingLogParser]) -> _Stream:
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = _Stream(make())
        return stream

    def poll_logs(self, now: float) -> tuple[int, bool]:
        """Read and parse new lines: (lines read, whether something critical arrived)."""
        wall = datetime.now(UTC)
        before = len(self.events)
        read = 0
        if self.kernel is not None:
            lines = self.kernel.poll()
            stream = self._stream("kernel", lambda: KernelLogParser(boot_time=_boot_time()))
            read += self._feed(stream, lines, wall, now)
        for path, lines in self.logs.poll().items():
            stream = self._stream(
                path, lambda path=path: TrainingLogParser(step_patterns=self.step_patterns, path=path)
            )
            read += self._feed(stream, lines, wall, now)
        if self.nvml_xids is not None:
            self.events += self.nvml_xids.drain()  # from its thread: critical ones ship at once like kernel ones
        for stream in self._streams.values():
            if stream.pending and now - stream.last_line >= IDLE_FLUSH:
                self.events += stream.parser.flush(now=wall)
                stream.pending = False
        return read, any(e.critical for e in self.events[before:])

    def _feed(self, stream: _Stream, lines: list[str], wall: datetime, now: float) -> int:
        if lines:
            for line in lines:
                self.events += stream.parser.feed(line, now=wall)
            stream.last_line = now
            stream.pending = True
        return len(lines)

    def flush_parsers(self) -> None:
        wall = datetime.now(UTC)
        for stream in self._streams.values():
            self.events += stream.parser.flush(now=wall)
            stream.pending = False

    def scan(self) -> list[Worker]:
        with self._scan_lock:
            return self.scanner.scan(time.monotonic())

    def read_gpus(self) -> list[GpuReading]:
        if self.gpus is None:
            return []
        readings = self.gpus.read()
        if readings:
            self.inventory = [r.inventory() for r in readings]
        return readings

    def take_sample(self) -> None:
        """Read every GPU once, stamped with this instant, into the batch being gathered."""
        readings = self.read_gpus()
        ts = datetime.now(UTC).isoformat()
        self.samples.add([_sample(ts, r) for r in readings])

    def watch_links(self) -> bool:
        """Whether an RDMA port went down since the last sample tick: a critical event each (agents/port_watch.py)."""
        events = self.port_watch.changes(self.node.link_states(), datetime.now(UTC))
        self.events += events
        return bool(events)

    def take_node_sample(self) -> None:
        """Read the network ports, the host and the volumes once, into the batch being gathered."""
        self.node_metrics += self.node.read()

    # -- directives ------------------------------------------------------------------------------

    def _on_directives(self, directives: list[dict[str, Any]]) -> None:
        for directive in directives:
            directive_id = str(directive.get("id"))
            if directive_id in self._seen_directives:
                continue  # the service repeats a directive until it expires; act once
            self._seen_directives.add(directive_id)
            kind = directive.get("kind")
            if kind == "dump_stacks":
                threading.Thread(
                    target=self._dump_stacks, args=(directive_id, directive.get("job_id")), daemon=True
                ).start()
            elif kind == "run_checks":
                threading.Thread(target=self._run_checks, args=(directive_id, directive), daemon=True).start()
            elif kind == "bundle":
                threading.Thread(target=self._send_bundle, args=(directive_id, directive), daemon=True).start()
            elif kind == "checkpoint":
                self._request_checkpoint(directive_id, directive)
            else:
                log.warning("ignoring unknown directive %s", directive)

    def _request_checkpoint(self, directive_id: str, directive: dict[str, Any]) -> None:
        """Planned maintenance ahead: write the request where the training side reads it (checkpoint_file), and
        signal the job's processes here when checkpoint_signal is set."""
        request = {
            "directive_id": directive_id,
            "job_id": directive.get("job_id"),
            "node": self.config.node_name,
            "reason": directive.get("reason"),
            "deadline": directive.get("deadline"),
            "requested_at": datetime.now(UTC).isoformat(),
        }
        path = self.config.checkpoint_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(orjson.dumps(request))
            tmp.replace(path)  # whole or absent: a reader never sees half a request
        except OSError as exc:
            log.error("directive %s: cannot write the checkpoint request to %s: %s", directive_id, path, exc)
        log.warning(
            "directive %s: checkpoint job %s before %s (%s): written to %s",
            directive_id,
            request["job_id"],
            request["deadline"],
            request["reason"],
            path,
        )
        if self.config.checkpoint_signal:
            signum = getattr(signal, self.config.checkpoint_signal.upper())
            for worker in self.workers:
                if worker.job_id == request["job_id"]:
                    try:
                        os.kill(worker.pid, signum)
                    except OSError as exc:
                        log.warning("directive %s: cannot signal pid %d: %s", directive_id, worker.pid, exc)

    def _dump_stacks(self, directive_id: str, job_id: str | None) -> None:
        workers = self.scan()
        targets: list[dict[str, Any]] = []
        for w in workers:
            if job_id is not None and w.job_id != job_id:
                continue
            base = {"job_id": w.job_id, "rank": w.rank}
            targets.append({"pid": w.pid, **base})
            targets += [{"pid": child["pid"], **base} for child in w.children]
        log.info("directive %s: dumping stacks of %d processes (job %s)", directive_id, len(targets), job_id)
        if targets:
            self.stacks.put(dump_all(targets, directive_id=directive_id, timeout=self.config.stack_timeout))

    def _bundle_targets(self) -> list[dict[str, Any]]:
        """The training processes whose stacks go into a bundle: every rank on the node."""
        return [{"pid": w.pid, "job_id": w.job_id, "rank": w.rank} for w in self.scan()]

    def _send_bundle(self, directive_id: str, directive: dict[str, Any]) -> None:
        """Collect an evidence bundle (agents/bundle.py) within the directive's bounds and upload it."""
        config = self.config
        try:
            timeout = min(config.bundle_timeout, float(directive.get("timeout_s") or config.bundle_timeout))
            max_bytes = int(config.bundle_max_mb * 2**20)
            max_bytes = min(max_bytes, int(directive.get("max_bytes") or max_bytes))
        except (TypeError, ValueError) as exc:
            log.warning("directive %s: bad bundle directive (%s); ignoring it", directive_id, exc)
            return
        with self._bundling:
            started = time.monotonic()
            sources = bundles.Sources(
                kmsg=config.kmsg,
                history=self.recent.snapshot,
                targets=self._bundle_targets if config.processes else None,
                stack_timeout=config.stack_timeout,
            )
            try:
                body, manifest = bundles.collect(
                    sources,
                    bundle_id=directive_id,
                    node=config.node_name,
                    decision_id=directive.get("decision_id"),
                    timeout_s=timeout,
                    max_bytes=max_bytes,
                    agent_version=AGENT_VERSION,
                )
            except Exception:  # a bug here must not cost the agent; the service shows "agent unreachable"
                log.exception("directive %s: the evidence bundle could not be collected", directive_id)
                return
            parts = ", ".join(f"{p['name']} {p['status']}" for p in manifest["parts"])
            log.info(
                "directive %s: bundle of %d bytes collected in %.1f s (%s)",
                directive_id, len(body), time.monotonic() - started, parts,
            )  # fmt: skip
            if config.server is None or config.token is None:
                return
            answer = upload(
                server=config.server, token=config.token, node=config.node_name, bundle_id=directive_id, body=body
            )
            if answer.stored:
                log.info("directive %s: bundle uploaded (HTTP %d)", directive_id, answer.status)
            else:
                log.error("directive %s: bundle not uploaded: %s %s", directive_id, answer.status or "", answer.message)

    def _run_checks(self, directive_id: str, directive: dict[str, Any]) -> None:
        """The stop-time checks the service asked for; their results (or the refusal) go with the next batch."""
        ts = datetime.now(UTC).isoformat()
        try:
            peer = Peer.from_wire(directive["peer"]) if directive.get("peer") else None
            options = Options(
                level=int(directive.get("level", 2)),
                force=bool(directive.get("force", False)),
                peer=peer,
                only=[str(name) for name in directive["only"]] if directive.get("only") else None,
                volumes=list(self.config.volumes),
                sysfs_root=str(self.config.sysfs_root),
                procfs_root=str(self.config.procfs_root),
                kernel_log=self.config.kmsg,
            )
        except (KeyError, TypeError, ValueError) as exc:
            self.checks.put([{"ts": ts, "directive_id": directive_id, "refused": f"bad directive: {exc}"}])
            return
        if not self._checking.acquire(blocking=False):
            self.checks.put([{"ts": ts, "directive_id": directive_id, "refused": "a check suite is already running"}])
            return
        try:
            log.info("directive %s: running the level-%d checks", directive_id, options.level)
            results = run_suite(options, busy_ranks=self.scan())
        except (Refused, ValueError) as exc:
            log.warning("directive %s: checks refused: %s", directive_id, exc)
            self.checks.put([{"ts": ts, "directive_id": directive_id, "refused": str(exc)}])
            return
        finally:
            self._checking.release()
        done = datetime.now(UTC).isoformat()
        self.checks.put([{"ts": done, "directive_id": directive_id, **r.to_wire()} for r in results])

    # -- batches ---------------------------------------------------------------------------------

    def build_batch(self, *, processes: bool) -> dict[str, Any]:
        """A batch of everything gathered since the last one: samples, events, stack dumps."""
        now = datetime.now(UTC)
        ts = now.isoformat()
        stacks: list[dict[str, Any]] = []
        while not self.stacks.empty():
            stacks += self.stacks.get_nowait()
        checks: list[dict[str, Any]] = []
        while not self.checks.empty():
            checks += self.checks.get_nowait()
        jobs = sorted({w.job_id for w in self.workers if w.job_id})
        now_mono = time.monotonic()
        self._jobs_seen.update(dict.fromkeys(jobs, now_mono))
        recent = [job for job, seen in self._jobs_seen.items() if now_mono - seen < JOB_LINGER_S]
        heartbeat: dict[str, Any] = {
            "agent_version": AGENT_VERSION,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "jobs": jobs,
        }
        if self.spool is not None:
            heartbeat["spool_depth"] = len(self.spool)
            heartbeat["dropped"] = dict(self.spool.dropped)
        if processes:
            heartbeat["gpus"] = self.inventory
            heartbeat["host"] = self.node.facts()
        batch: dict[str, Any] = {
            "batch_id": self.samples.batch_id,  # the samples' journal names it: a replay is stored once
            "node": self.config.node_name,
            "sent_at": ts,
            "heartbeat": heartbeat,
            "metrics": self.samples.metrics,
            "node_metrics": self.node_metrics,
            "logs": [e.to_wire() for e in self.events],
            "stacks": stacks,
            "processes": [w.snapshot(now) for w in self.workers] if processes else [],
        }
        if checks:
            batch["checks"] = checks  # stop-time check results (agents/checks), for the directive that asked
        if len(recent) == 1 and jobs:
            batch["job_id"] = recent[0]  # its processes run here: every sample of the batch is the job's
        elif len(recent) == 1:
            # They ended here in the last JOB_LINGER_S: the job's last log lines still are its, the GPUs' samples are
            # not (a machine evicted and in repair kept its fault's counters climbing under the job for 10 min, and
            # was accused again on them when it came back to the job).
            for event in batch["logs"]:
                event.setdefault("job_id", recent[0])
        self.events = []
        self.node_metrics = []
        return batch

    def emit(self, batch: dict[str, Any]) -> None:
        if self.config.dry_run:
            self.out.write(orjson.dumps(batch).decode() + "\n")
            self.out.flush()
            self.samples.shipped()
            return
        self._spool(batch)
        self.samples.shipped()  # after the batch is spooled: a kill in between re-sends the same batch id
        self._save_positions()  # only now are the lines read so far safe on disk

    def _spool(self, batch: dict[str, Any]) -> None:
        assert self.spool is not None
        counts = {kind: len(batch.get(kind, ())) for kind in KINDS}
        raw = orjson.dumps(batch)
        self.recent.add(raw)
        self.spool.put(gzip.compress(raw, compresslevel=5), counts)

    def _recover_samples(self) -> None:
        """Spool the samples a killed agent had taken but not yet shipped, under the batch id they had."""
        for path, batch_id, metrics in left_over(self.config.spool_path):
            if metrics:
                self._spool(
                    {
                        "batch_id": batch_id,
                        "node": self.config.node_name,
                        "sent_at": datetime.now(UTC).isoformat(),
                        "metrics": metrics,
                        "logs": [],
                        "stacks": [],
                        "processes": [],
                    }
                )
                log.info("spooled %d GPU samples the previous agent had not shipped", len(metrics))
            path.unlink(missing_ok=True)

    def _positions_file(self) -> Path:
        return self.config.spool_path.parent / f"{self.config.spool_path.name}.positions.json"

    def _load_positions(self) -> dict[str, Position]:
        try:
            return orjson.loads(self._positions_file().read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}

    def _save_positions(self) -> None:
        positions = self.logs.positions()
        kernel_position = getattr(self.kernel, "position", None)
        if kernel_position is not None and (pos := kernel_position()) is not None:
            positions[self.config.kmsg] = pos
        path = self._positions_file()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(positions))
        tmp.replace(path)

    # -- loop ------------------------------------------------------------------------------------

    def run(self) -> int:
        if self.config.once:
            return self._run_once()
        if self.shipper is not None:
            self._ship_thread = threading.Thread(target=self.shipper.run, name="shipper", daemon=True)
            self._ship_thread.start()
        if self.cloud is not None:
            self.cloud.start()
        config = self.config
        assert config.sample_interval is not None  # resolved by AgentConfig.check
        log.info(
            "agent %s for node %s: sampling every %gs, shipping every %gs, server %s, spool %s",
            AGENT_VERSION,
            config.node_name,
            config.sample_interval,
            config.ship_interval,
            config.server or "(dry run)",
            config.spool_path if self.spool is not None else "-",
        )
        start = time.monotonic()
        sample, ship = _Ticker(config.sample_interval, start), _Ticker(config.ship_interval, start)
        next_procs = start
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                _, critical = self.poll_logs(now)
                if self.shipper is not None and self.shipper.auth_error:
                    return EXIT_AUTH
                if sample.fire(now):
                    self.take_sample()  # first, so a coinciding ship tick carries it
                    critical = self.watch_links() or critical
                if ship.fire(now) or len(self.samples) >= MAX_BATCH_METRICS:
                    processes = now >= next_procs
                    if processes:
                        self.workers = self.scan()
                        next_procs = now + config.process_interval
                    self.take_node_sample()
                    self.emit(self.build_batch(processes=processes))
                elif critical or not self.stacks.empty() or not self.checks.empty():
                    self.emit(self.build_batch(processes=False))  # at once, with the samples gathered so far
                self.stopping.wait(self._sleep(sample, ship))
        finally:
            self._shutdown()
        return 0

    @staticmethod
    def _sleep(*tickers: _Ticker) -> float:
        """Until the next log poll, or the next tick if that is sooner."""
        now = time.monotonic()
        return max(0.0, min(TICK, *(t.due - now for t in tickers)))

    def _run_once(self) -> int:
        while self.poll_logs(time.monotonic())[0]:
            pass  # a source holding more than one poll's worth (READ_LIMIT) needs several reads
        self.flush_parsers()
        self.workers = self.scan()
        self.take_sample()
        # CPU percentages are a difference of two readings: the first was taken at start.
        time.sleep(max(0.0, ONCE_CPU_SPAN_S - (time.monotonic() - self._primed)))
        self.take_node_sample()
        self.emit(self.build_batch(processes=True))
        code = 0
        if self.shipper is not None and not self.shipper.drain(timeout=30):
            log.error(
                "could not ship within 30 s; %d batches stay in the spool for the next run", len(self.spool or [])
            )
            code = EXIT_AUTH if self.shipper.auth_error else 1
        if self.shipper is not None:
            self.shipper.close()
        self._close_sources()
        return code

    def _shutdown(self) -> None:
        """Ship what is left within SHUTDOWN_S of the stop signal; the rest stays in the spool.

        A node being drained or rebooted must not wait on a service that is gone: an unacknowledged batch
        stays spooled (batches leave the spool only when the service acknowledges them), and the next start
        ships it; the service stores a batch sent twice once (by its batch_id)."""
        deadline = time.monotonic() + SHUTDOWN_S
        if self.cloud is not None:
            self.cloud.stopping.set()  # its thread is a daemon: a poll in flight does not hold the exit
        log.info("stopping: shipping what is left (for at most %g s)", SHUTDOWN_S)
        self.poll_logs(time.monotonic())  # lines written since the last tick
        self.flush_parsers()
        if self.events or not self.stacks.empty() or not self.checks.empty() or len(self.samples):
            self.emit(self.build_batch(processes=False))  # samples taken since the last ship tick too
        if self.shipper is not None:
            self.shipper.stopping.set()
            busy = [t for t in (self._ship_thread,) if t is not None]
            for thread in busy:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if self.shipper.auth_error is None and not any(t.is_alive() for t in busy):
                # The POST itself can block (a silent server), so the last drain runs where exit need not wait.
                left = max(0.0, deadline - time.monotonic())
                finisher = threading.Thread(target=self.shipper.drain, args=(left,), name="drain", daemon=True)
                finisher.start()
                finisher.join(timeout=left)
                busy.append(finisher)
            if not any(t.is_alive() for t in busy):
                self.shipper.close()  # else a thread still uses it; the process exit closes its socket
            if self.spool is not None and len(self.spool):
                log.info("%d batches stay in the spool for the next start", len(self.spool))
        self._close_sources()

    def _close_sources(self) -> None:
        self.samples.close()
        if self.kernel is not None:
            self.kernel.close()
        self.logs.close()
        if self.nvml_xids is not None:
            self.nvml_xids.close()
        if self.gpus is not None:
            self.gpus.close()
        self.node.close()


def install_signal_handlers(agent: Agent) -> None:
    def stop(signum: int, _frame: Any) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
