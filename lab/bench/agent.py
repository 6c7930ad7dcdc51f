"""`faultline bench agent`: the agent's CPU, memory and shipping cost on a busy node.

A real agent process follows two growing training logs, scrapes an 8-GPU dcgm-exporter page every
sample interval, scans /proc (with eight torchrun-like workers on it), reads the network and host
collectors every ship interval (a fake sysfs of 8 InfiniBand ports, 1 RoCE port and 2 Ethernet NICs whose
counters move every second, lab/bench/agent_node.py; the real /proc; one watched volume) and ships gzip
batches to a local receiver every ship interval. The agent's own CPU time (utime + stime from /proc) and RSS are sampled
from outside. Target: at most 2% of one core and 80 MB RSS.

It runs twice: with the given intervals (the agent's defaults: sample 1 s, ship 5 s) and with one batch
per sample (ship every 1 s, the old default), and prints requests per second (per node, and for a
2,048-node cluster) and gzip bytes per GPU sample side by side: the trade-off of the ship interval.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from lab.bench.agent_node import NodeLoad, node_load
from lab.bench.busy import note, watch_other_load

CPU_TARGET_PCT = 2.0
RSS_TARGET_MB = 80.0
CLUSTER_NODES = 2048  # 16,384 GPUs at 8 per node
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

# dcgm-exporter's default counters plus the profiling ones: 36 fields, as a 4.x exporter labels them.
_FIELDS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", 1980), ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 2619),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 9223372036854775794), ("DCGM_FI_DEV_GPU_TEMP", "gauge", 61),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", 640.5), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", 4.1e9),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", 0), ("DCGM_FI_DEV_GPU_UTIL", "gauge", 97),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", 44), ("DCGM_FI_DEV_ENC_UTIL", "gauge", 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", 0), ("DCGM_FI_DEV_XID_ERRORS", "gauge", 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", 11000), ("DCGM_FI_DEV_FB_USED", "gauge", 70000),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", 500), ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", 0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", 0), ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", 3),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", 0), ("DCGM_FI_DEV_RETIRED_SBE", "counter", 0),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", 0), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", 0), ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", 0),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", 0),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", 8.1e12), ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", 0),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", 0), ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", 0.95), ("DCGM_FI_PROF_SM_ACTIVE", "gauge", 0.88),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", 0.52), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", 0.61),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", 0.47), ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", 1.1e9),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", 2.1e11),
]  # fmt: skip

_LOG_LINES = [
    "step={step} loss={loss:.4f} grad_norm={gn:.3f} elapsed_ms={ms:.1f}",
    "node-07:12345:12399 [3] NCCL INFO Channel 04/0 : 3[3] -> 11[3] [send] via NET/IB/1/GDRDMA",
    "[rank3]: iteration {step}: samples/s 812.4 tokens/s 3.3e6",
    "Saving checkpoint shard to /ckpt/step_{step}/rank3.pt",
]


def exporter_page(gpus: int, rng: random.Random) -> bytes:
    lines = []
    for name, kind, base in _FIELDS:
        lines.append(f"# HELP {name} {name}.\n# TYPE {name} {kind}")
        for g in range(gpus):
            value = base if base >= 9e18 or not base else base * (1 + rng.gauss(0, 0.01))
            labels = (
                f'gpu="{g}",UUID="GPU-0d6f4c1e-9a51-4c2b-8f7e-{g:012x}",pci_bus_id="00000000:{0x18 + g:02X}:00.0",'
                f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="bench-node"'
            )
            lines.append(f"{name}{{{labels}}} {value:g}")
    return ("\n".join(lines) + "\n").encode()


@contextmanager
def local_endpoints(gpus: int) -> Iterator[dict[str, Any]]:
    """A dcgm-exporter page and an ingest receiver on one loopback port."""
    stats: dict[str, Any] = {"batches": 0, "bytes": 0, "items": 0, "gpu_samples": 0, "node_samples": 0}
    rng = random.Random(7)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real service behind a proxy would

        def do_GET(self) -> None:
            self._answer(exporter_page(gpus, rng), "text/plain; version=0.0.4")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            batch = orjson.loads(gzip.decompress(raw))
            stats["batches"] += 1
            stats["bytes"] += len(raw)
            stats["items"] += sum(
                len(batch.get(k, ())) for k in ("metrics", "logs", "stacks", "processes", "node_metrics")
            )
            stats["gpu_samples"] += len(batch["metrics"])
            stats["node_samples"] += len(batch.get("node_metrics", ()))
            self._answer(b'{"status":"accepted","directives":[]}', "application/json")

        def _answer(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stats["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield stats
    finally:
        server.shutdown()
        server.server_close()


def _write_logs(paths: list[Path], rate: float, stop: threading.Event) -> None:
    rng = random.Random(3)
    files = [p.open("a", buffering=1) for p in paths]
    step = 0
    try:
        while not stop.wait(1.0 / rate):
            step += 1
            for f in files:
                template = _LOG_LINES[0] if step % 2 else rng.choice(_LOG_LINES)
                f.write(template.format(step=step, loss=2.5 - step * 1e-4, gn=1 + rng.random() / 10, ms=980.0) + "\n")
    finally:
        for f in files:
            f.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE / 2**20


def _shipped(endpoints: dict[str, Any]) -> tuple[int, int, int, int]:
    return endpoints["batches"], endpoints["bytes"], endpoints["gpu_samples"], endpoints["node_samples"]


def run_bench(
    *,
    duration: float,
    warmup: float,
    sample_interval: float,
    ship_interval: float,
    gpus: int,
    logs: int,
    rate: float,
    gpu_source: str = "dcgm",
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="faultline-bench-agent-") as tmp,
        local_endpoints(gpus) as endpoints,
        node_load(Path(tmp)) as node,
    ):
        root = Path(tmp)
        paths = [root / f"rank{i}.log" for i in range(logs)]
        for p in paths:
            p.touch()
        # Eight torchrun-like workers for the /proc scan to find (sleeping: they cost the agent, not the box).
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(3600)"],
                env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "8", "FAULTLINE_JOB_ID": "b"},
            )
            for r in range(8)
        ]
        stop = threading.Event()
        writer = threading.Thread(target=_write_logs, args=(paths, rate, stop), daemon=True)
        writer.start()
        launcher, gpu_flags, env = _gpu_source(gpu_source, gpus, endpoints["url"])
        command = [
            *launcher, "agent", "--server", endpoints["url"], "--token", "bench",
            "--node-name", "bench-node", "--sample-interval", str(sample_interval),
            "--ship-interval", str(ship_interval), *gpu_flags,
            "--kmsg", "none", "--spool-dir", str(root / "spool"), *[a for p in paths for a in ("--log", str(p))],
            *node.agent_args,
        ]  # fmt: skip
        agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(root / "agent.log", "wb"), env=env)  # noqa: SIM115
        try:
            print(
                f"agent started (pid {agent.pid}); warming up {warmup:g} s, then measuring {duration:g} s", flush=True
            )
            time.sleep(warmup)
            if agent.poll() is not None:
                raise SystemExit("the agent exited: " + (root / "agent.log").read_text()[-2000:])
            cpu0, t0, shipped0 = _cpu_seconds(agent.pid), time.monotonic(), _shipped(endpoints)
            rss = []
            while time.monotonic() - t0 < duration:
                time.sleep(1.0)
                rss.append(_rss_mb(agent.pid))
            elapsed = time.monotonic() - t0
            cpu_pct = 100 * (_cpu_seconds(agent.pid) - cpu0) / elapsed
            batches, sent, samples, node_samples = (b - a for a, b in zip(shipped0, _shipped(endpoints), strict=True))
        finally:
            stop.set()
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
            for w in workers:
                w.kill()
                w.wait()
    requests_per_s = batches / elapsed
    return {
        "gpu_source": gpu_source,
        "sample_interval_s": sample_interval,
        "ship_interval_s": ship_interval,
        "gpus": gpus,
        "followed_logs": logs,
        "log_lines_per_s": rate * logs,
        "measured_s": duration,
        "cpu_pct_of_one_core": round(cpu_pct, 2),
        "rss_mb_max": round(max(rss), 1),
        "rss_mb_mean": round(sum(rss) / len(rss), 1),
        "batches_shipped": batches,
        "requests_per_s": round(requests_per_s, 3),
        f"requests_per_s_at_{CLUSTER_NODES}_nodes": round(requests_per_s * CLUSTER_NODES),
        "gpu_samples_shipped": samples,
        "node_samples_shipped": node_samples,
        # Everything a batch carries (logs, processes, heartbeat), over the GPU samples in it.
        "bytes_per_gpu_sample_gzip": round(sent / max(1, samples), 1),
        "bytes_per_batch_gzip": round(sent / max(1, batches)),
        "cpu_target_met": cpu_pct <= CPU_TARGET_PCT,
        "rss_target_met": max(rss) <= RSS_TARGET_MB,
    }


# -- the NVML source (agents/nvml.py), with lab/fakes/nvml.py standing in for the driver -------------------

# The agent, started with the fake pynvml in place of the real one (a source checkout: tests/ is not installed).
_FAKE_NVML_AGENT = (
    "import sys; from lab.fakes.nvml import install; install({gpus}); from faultline.cli import main; sys.exit(main())"
)


def _gpu_source(gpu_source: str, gpus: int, url: str) -> tuple[list[str], list[str], dict[str, str]]:
    """(how to start the agent, its GPU flags, its environment) for dcgm-exporter, the real NVML or the fake."""
    if gpu_source == "dcgm":
        return [sys.executable, "-m", "faultline"], ["--dcgm-url", url + "/metrics"], dict(os.environ)
    if gpu_source == "nvml":  # this host's GPUs through the driver: the agent's default without --dcgm-url
        return [sys.executable, "-m", "faultline"], [], dict(os.environ)
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "lab" / "fakes" / "nvml.py").exists():
        raise SystemExit("--gpu-source nvml-fake needs a source checkout (lab/fakes/nvml.py)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    return [sys.executable, "-c", _FAKE_NVML_AGENT.format(gpus=int(gpus))], [], env


def nvml_source_cost(*, gpus: int, sample_interval: float, seconds: float = 60.0, real: bool = False) -> dict[str, Any]:
    """The NVML reader's own cost over `seconds` of agent time: calls (fake only) and CPU per read, share of a core.

    Reads back to back, the clock advanced by `sample_interval` per read, so the slow readings (agents/nvml.py
    SLOW_PERIOD_S) come in the proportion they do in a real run. The fake answers in microseconds of Python; a
    driver call costs more (an ioctl), so with the fake the calls per second are the figure to carry to real
    hardware, and with `real` (this host's driver, every GPU it has) the CPU and wall time are the figures."""
    from agents.nvml import Nvml

    if real:
        import pynvml

        driver: Any = pynvml
        driver.nvmlInit()
        gpus = driver.nvmlDeviceGetCount()
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from lab.fakes.nvml import FakeNvml  # a source checkout only, like the agent started above

        driver = FakeNvml(gpus)
        driver.nvmlInit()
    reader = Nvml(driver, gpus)
    reads = max(1, round(seconds / sample_interval))
    clock = [time.monotonic()]
    reader.clock = lambda: clock[0]
    try:
        reader.read()  # the first read takes everything once; the steady state is what counts
        if not real:
            driver.calls.clear()
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        fields = 0
        for _ in range(reads):
            clock[0] += sample_interval
            fields += sum(len(r.fields) for r in reader.read())
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    finally:
        reader.close()
    per_read_ms = 1000 * cpu / reads
    calls = None if real else round(driver.total_calls() / reads, 1)
    return {
        "driver": "real" if real else "fake",
        "gpus": gpus,
        "sample_interval_s": sample_interval,
        "reads": reads,
        "nvml_calls_per_read": calls,
        "nvml_calls_per_s": None if calls is None else round(calls / sample_interval, 1),
        "fields_per_read": round(fields / reads, 1),
        "cpu_ms_per_read": round(per_read_ms, 3),
        "wall_ms_per_read": round(1000 * wall / reads, 3),
        "cpu_pct_of_one_core": round(per_read_ms / 10 / sample_interval, 3),
        "share_of_agent_budget_pct": round(100 * per_read_ms / 10 / sample_interval / CPU_TARGET_PCT, 1),
    }


def add_parser(bench_sub: Any) -> None:
    agent = bench_sub.add_parser(
        "agent",
        help="the agent's CPU, RSS, requests/s and bytes per sample on a busy 8-GPU node (target: 2%%, 80 MB)",
    )
    agent.add_argument("--duration", type=float, default=60.0, help="seconds measured, per run (default 60)")
    agent.add_argument("--warmup", type=float, default=10.0)
    agent.add_argument("--sample-interval", type=float, default=1.0, help="seconds between samples (default 1)")
    agent.add_argument(
        "--ship-interval", "--interval", type=float, default=5.0, help="seconds between batches (default 5)"
    )
    agent.add_argument(
        "--no-baseline", action="store_true", help="skip the second run, which ships every sample (every 1 s)"
    )
    agent.add_argument("--gpus", type=int, default=8)
    agent.add_argument("--logs", type=int, default=2, help="followed training logs (default 2)")
    agent.add_argument("--lines-per-second", type=float, default=5.0, help="per log (default 5)")
    agent.add_argument("--json", type=Path, help="also write the figures to this file")
    agent.add_argument(
        "--gpu-source",
        choices=["dcgm", "nvml", "nvml-fake"],
        default="dcgm",
        help="GPU counters from a dcgm-exporter page of --gpus GPUs (default), through NVML from this host's own "
        "GPUs (--gpus is then what the driver has), or through NVML with a fake driver of --gpus H100s "
        "(lab/fakes/nvml.py; a source checkout); with NVML the reader's own share is printed too",
    )


def _print_table(runs: dict[str, dict[str, Any]]) -> None:
    names = list(runs)
    keys = list(runs[names[0]])
    width = max(map(len, keys))
    columns = [max(len(name), *(len(str(run[k])) for k in keys)) for name, run in runs.items()]
    print(f"{'':<{width}}  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, columns, strict=True)))
    for key in keys:
        cells = "  ".join(f"{run[key]!s:>{w}}" for run, w in zip(runs.values(), columns, strict=True))
        print(f"{key:<{width}}  {cells}")


_SOURCES = {"dcgm": "dcgm-exporter page", "nvml": "NVML, this host's driver", "nvml-fake": "NVML, fake driver"}


def _print_budget(runs: dict[str, dict[str, Any]]) -> None:
    """Each run against the agent's budget, with the load it carried."""
    print(f"\nbudget: {CPU_TARGET_PCT:g}% of one core, {RSS_TARGET_MB:g} MB RSS; every collector on")
    for name, run in runs.items():
        cpu, rss = run["cpu_pct_of_one_core"], run["rss_mb_max"]
        print(
            f"  {name}: CPU {cpu:.2f}% of one core {'PASS' if run['cpu_target_met'] else 'FAIL'}, "
            f"peak RSS {rss:.1f} MB {'PASS' if run['rss_target_met'] else 'FAIL'}"
        )
    first = next(iter(runs.values()))
    source = _SOURCES[first["gpu_source"]]
    print(
        f"  load: {first['gpus']} GPUs sampled every {first['sample_interval_s']:g} s ({source}), "
        f"{first['followed_logs']} logs at {first['log_lines_per_s']:g} lines/s in all, 8 training processes "
        f"scanned; {NodeLoad.describe()}"
    )


def run(args: argparse.Namespace) -> int:
    settings = {"duration": args.duration, "warmup": args.warmup, "gpus": args.gpus, "logs": args.logs}
    settings["rate"] = args.lines_per_second
    settings["gpu_source"] = args.gpu_source
    if args.gpu_source == "nvml":  # the agent reads every GPU the driver has; the figures say how many
        import pynvml

        pynvml.nvmlInit()
        settings["gpus"] = pynvml.nvmlDeviceGetCount()
    label = f"sample {args.sample_interval:g}s/ship {args.ship_interval:g}s"
    with watch_other_load() as watched:
        runs = {label: run_bench(sample_interval=args.sample_interval, ship_interval=args.ship_interval, **settings)}
        if not args.no_baseline and (args.sample_interval, args.ship_interval) != (1.0, 1.0):
            runs["ship every 1s"] = run_bench(sample_interval=1.0, ship_interval=1.0, **settings)
    _print_table(runs)
    _print_budget(runs)
    if args.gpu_source in ("nvml", "nvml-fake"):
        real = args.gpu_source == "nvml"
        runs["nvml source"] = nvml_source_cost(gpus=args.gpus, sample_interval=args.sample_interval, real=real)
        print(f"\nthe NVML reader alone ({'this host' if real else 'fake'} driver):")
        _print_table({"nvml source": runs["nvml source"]})
    print(note(runs, watched))
    if args.json:
        args.json.write_text(orjson.dumps(runs, option=orjson.OPT_INDENT_2).decode())
    return 0


def main(argv: list[str]) -> int:
    """`faultline bench agent ...`, its options parsed here (the CLI hands over what follows `agent`)."""
    parser = argparse.ArgumentParser(prog="faultline bench")
    add_parser(parser.add_subparsers(dest="bench_command", required=True))
    return run(parser.parse_args(["agent", *argv]))
