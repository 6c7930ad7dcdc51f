"""All-reduce bus bandwidth through torch.distributed: across this node's GPUs (NCCL over NVLink), and between
this node and a known-good peer the service picks (NCCL over the NICs), so a bad link shows against a good one.

Each rank is its own process (allreduce_rank.py), started here and killed at the timeout, so a hung collective
cannot hold the agent. Every rank checks the sums it received; the figure is nccl-tests' bus bandwidth. The
throughput is judged by the service against the fleet (ml/check_criteria.py): here a wrong sum, an error or a
hang fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

from agents.checks.result import CheckResult

ALLREDUCE_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class Peer:
    """The cross-node pairing the service sends: both nodes get the same address (the rank-0 node's)."""

    addr: str
    port: int
    node_rank: int
    nnodes: int = 2

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Peer:
        peer = cls(str(raw["addr"]), int(raw["port"]), int(raw["node_rank"]), int(raw.get("nnodes", 2)))
        if not (0 < peer.port < 65536 and 0 <= peer.node_rank < peer.nnodes and peer.nnodes >= 2):
            raise ValueError(f"bad peer {raw}")
        return peer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def allreduce(
    check: str,
    *,
    nproc: int,
    backend: str = "nccl",
    peer: Peer | None = None,
    nbytes: int = ALLREDUCE_BYTES,
    iters: int = 20,
    timeout: float = 180.0,
    latency_iters: int = 0,
    alltoall: bool = False,
) -> CheckResult:
    """Run `nproc` local ranks (of `nproc * nnodes`) and report what they measured; with `latency_iters`, also a
    one-element all-reduce's latency (the slowest rank's, in the evidence), with `alltoall`, also an all-to-all
    whose sums are checked (the preflight's: it crosses every pair of nodes)."""
    addr, port = (peer.addr, peer.port) if peer else ("127.0.0.1", free_port())
    node_rank, nnodes = (peer.node_rank, peer.nnodes) if peer else (0, 1)
    world = nproc * nnodes
    subject = "node"
    evidence: dict[str, Any] = {"backend": backend, "world_size": world, "bytes": nbytes}
    if peer:
        evidence["peer"] = {"addr": addr, "port": port, "node_rank": node_rank}
    if world < 2:
        return CheckResult(check, subject, "not_available", evidence={**evidence, "reason": "needs two GPUs or more"})
    started = time.monotonic()
    with contextlib.ExitStack() as files:
        procs: list[subprocess.Popen[str]] = []
        logs: list[tuple[IO[str], IO[str]]] = []
        for local in range(nproc):
            env = {
                **os.environ,
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                "RANK": str(node_rank * nproc + local),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local),
                "FAULTLINE_CHECK_BACKEND": backend,
                "FAULTLINE_CHECK_BYTES": str(nbytes),
                "FAULTLINE_CHECK_ITERS": str(iters),
                "FAULTLINE_CHECK_TIMEOUT": str(timeout),
                "FAULTLINE_CHECK_LATENCY_ITERS": str(latency_iters),
                "FAULTLINE_CHECK_ALLTOALL": "1" if alltoall else "0",
            }
            # Files, not pipes: the ranks are waited on together, and a rank that logs much (NCCL_DEBUG=INFO)
            # must not block on a full pipe nobody reads yet.
            out, err = (files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2))
            logs.append((out, err))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "agents.checks.allreduce_rank"], env=env, stdout=out, stderr=err
                )
            )
        timed_out = _wait(procs, deadline=started + timeout)
        ended = [(proc.returncode, _read(out), _read(err)) for proc, (out, err) in zip(procs, logs, strict=True)]
    took = round(time.monotonic() - started, 2)
    ranks = []
    for _, out, _ in ended:
        for line in out.splitlines():
            if line.startswith("{"):
                ranks.append(json.loads(line))
    failed = [f"exit {code}: {err.strip()[-300:]}" for code, _, err in ended if code != 0]
    if timed_out or failed or len(ranks) < nproc:
        evidence["errors"] = ([f"timed out after {timeout:g} s"] if timed_out else []) + failed
        return CheckResult(check, subject, "fail", unit="GB/s", evidence=evidence, duration_s=took)
    busbw = round(min(r["busbw_gbps"] for r in ranks), 2)  # the slowest rank is what a job would see
    wrong = sum(r["wrong_elements"] for r in ranks)
    evidence["ranks"] = ranks
    latencies = [r["latency_us"] for r in ranks if "latency_us" in r]
    if latencies:
        evidence["latency_us"] = round(max(latencies), 1)
    if wrong:
        evidence["problems"] = [f"{wrong} elements summed wrongly"]
    return CheckResult(
        check, subject, "fail" if wrong else "pass", measured=busbw, unit="GB/s", evidence=evidence, duration_s=took
    )


def _read(file: IO[str]) -> str:
    file.seek(0)
    return file.read()


def _wait(procs: list[subprocess.Popen[str]], *, deadline: float) -> bool:
    """Until every rank exits, or one fails (its peers would wait for it until the timeout: the collective cannot
    finish without it), or the deadline passes; the ranks still running are then killed. True on a time-out."""
    while None in (codes := [proc.poll() for proc in procs]):  # every rank polled: any() would stop early
        failed = any(code not in (None, 0) for code in codes)
        if failed or time.monotonic() >= deadline:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            return not failed
        time.sleep(0.1)
    return False


def gpu_count(procfs_root: str = "/proc") -> int:
    """The node's NVIDIA GPUs, from the driver's /proc entries (the agent never imports PyTorch itself), or as
    many as CUDA_VISIBLE_DEVICES names."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir(os.path.join(procfs_root, "driver", "nvidia", "gpus")))
    except OSError:
        return 0


def run(check: str, *, peer: Peer | None = None, timeout: float = 180.0, procfs_root: str = "/proc") -> CheckResult:
    gpus = gpu_count(procfs_root)
    if gpus == 0:
        return CheckResult(check, "node", "not_available", evidence={"reason": "no NVIDIA GPU on this node for NCCL"})
    return allreduce(check, nproc=gpus, peer=peer, timeout=timeout)
