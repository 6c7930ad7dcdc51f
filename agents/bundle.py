"""An evidence bundle: what a node shows when a decision is about to take it out, before it is wiped or rebooted.

The service sends a `bundle` directive on an evict, diagnose or RMA decision. The agent collects, each part bounded
in time (the whole within the directive's `timeout_s`) and in size (the whole tar.gz under its `max_bytes`):
the kernel log's tail, `nvidia-smi -q`, `dcgmi diag -r 1`, its own last minutes of shipped batches, py-spy dumps of
the training processes and `nvidia-bug-report.sh`. A tool that is not installed is a `missing` part in the
manifest, never an error. The tar.gz holds manifest.json first (each part: file, status, bytes, seconds, truncated,
error), then one file per part.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from agents.stacks import dump, find_py_spy

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
# Kept free of parts under the cap: the manifest, tar headers (512 bytes a member) and gzip's own bytes.
RESERVE_BYTES = 64 * 1024
# Each part's own bounds; the bundle's remaining time and bytes bound them further.
PART_SECONDS = {"nvidia_smi": 20.0, "py_spy": 20.0, "dcgmi_diag": 45.0, "nvidia_bug_report": 120.0, "kernel_log": 10.0}
PART_BYTES = {
    "kernel_log": 4 * 2**20,
    "agent_samples": 4 * 2**20,
    "nvidia_smi": 2 * 2**20,
    "py_spy": 2 * 2**20,
    "dcgmi_diag": 2**20,
}
KERNEL_JOURNAL_LINES = 20_000


@dataclass
class Part:
    """One part of the bundle as the manifest lists it."""

    name: str
    file: str | None = None
    status: str = "ok"  # ok, missing (tool not installed), skipped (nothing to collect), error, timeout
    bytes: int = 0
    seconds: float = 0.0
    truncated: bool = False
    error: str | None = None
    source: str | None = None  # the file read or the command run
    content: bytes = field(default=b"", repr=False)

    def wire(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "content"}
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class Sources:
    """Where the agent's own evidence comes from."""

    kmsg: str = "auto"  # the agent's --kmsg: auto, none, journald, a device or a file
    history: Callable[[], list[bytes]] | None = None  # the agent's last shipped batches, oldest first (JSON each)
    targets: Callable[[], list[dict[str, Any]]] | None = None  # training processes: {pid, rank, job_id}
    stack_timeout: float = 10.0


@dataclass
class Budget:
    """The bundle's time and bytes left."""

    deadline: float
    bytes_left: int

    def seconds(self, part: str) -> float:
        return max(0.0, min(PART_SECONDS.get(part, 30.0), self.deadline - time.monotonic()))

    def cap(self, part: str) -> int:
        return max(0, min(PART_BYTES.get(part, self.bytes_left), self.bytes_left))


# -- bounded reading -----------------------------------------------------------------------------------


def _tail(data: bytes, cap: int) -> tuple[bytes, bool]:
    """The last `cap` bytes, from a line start when one is near: a log's newest lines matter most."""
    if len(data) <= cap:
        return data, False
    cut = data[len(data) - cap :]
    newline = cut.find(b"\n")
    return (cut[newline + 1 :] if 0 <= newline < 4096 else cut), True


def _tail_file(path: Path, cap: int) -> tuple[bytes, bool]:
    size = path.stat().st_size
    with path.open("rb") as handle:
        if size > cap:
            handle.seek(size - cap)
        data = handle.read(cap)
    if size > cap:  # start at the first whole line
        newline = data.find(b"\n")
        data = data[newline + 1 :] if 0 <= newline < 4096 else data
    return data, size > cap


def _read_kmsg(path: str, cap: int, deadline: float) -> tuple[bytes, bool]:
    """The kernel's ring buffer through /dev/kmsg: records from the oldest kept, read until none is left."""
    kept: deque[bytes] = deque()
    size = 0
    truncated = False
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while time.monotonic() < deadline:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # the record was overwritten while we read: go on with the next
            if not record:
                break
            kept.append(record if record.endswith(b"\n") else record + b"\n")
            size += len(kept[-1])
            while size > cap and kept:
                size -= len(kept.popleft())
                truncated = True
    finally:
        os.close(fd)
    return b"".join(kept), truncated


def _run(argv: list[str], *, timeout: float, cap: int, cwd: str | None = None) -> tuple[bytes, bool, str | None, str]:
    """Run a tool with its output in a file (never all in memory): (head of output, truncated, error, status).

    It runs in its own session, so a timeout kills what it started too (nvidia-bug-report.sh runs many tools)."""
    if timeout <= 0:
        return b"", False, "no time left in the bundle", "skipped"
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True
            )
        except OSError as exc:
            return b"", False, f"cannot run {argv[0]}: {exc}", "error"
        status, error = "ok", None
        try:
            code = proc.wait(timeout=timeout)
            if code != 0:
                status, error = "error", f"{Path(argv[0]).name} exited with status {code}"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status, error = "timeout", f"{Path(argv[0]).name} took longer than {timeout:g} s; killed"
        size = out.seek(0, os.SEEK_END)
        out.seek(0)
        return out.read(cap), size > cap, error, status


# -- the parts ------------------------------------------------------------------------------------------


def _timed(name: str, file: str, collect: Callable[[Part], None]) -> Part:
    part = Part(name=name, file=file)
    started = time.monotonic()
    try:
        collect(part)
    except Exception as exc:  # one part failing must not cost the others
        log.warning("bundle part %s failed: %s", name, exc)
        part.status, part.error = "error", f"{type(exc).__name__}: {exc}"
    part.seconds = round(time.monotonic() - started, 3)
    part.bytes = len(part.content)
    if not part.content:
        part.file = None
    return part


def _tool_part(name: str, file: str, argv: list[str], budget: Budget) -> Part:
    def collect(part: Part) -> None:
        tool = shutil.which(argv[0])
        part.source = " ".join(argv)
        if tool is None:
            part.status, part.error = "missing", f"{argv[0]} is not installed"
            return
        part.content, part.truncated, part.error, part.status = _run(
            [tool, *argv[1:]], timeout=budget.seconds(name), cap=budget.cap(name)
        )

    return _timed(name, file, collect)


def _kernel_part(kmsg: str, budget: Budget) -> Part:
    def collect(part: Part) -> None:
        cap = budget.cap("kernel_log")
        spec = kmsg
        if spec == "auto":
            spec = "/dev/kmsg"
        if spec == "none":
            part.status, part.error = "skipped", "the agent follows no kernel log (--kmsg none)"
            return
        if spec == "journald":
            journalctl = shutil.which("journalctl")
            part.source = f"journalctl -k -b -n {KERNEL_JOURNAL_LINES}"
            if journalctl is None:
                part.status, part.error = "missing", "journalctl is not installed"
                return
            argv = [journalctl, "-k", "-b", "--no-pager", "-o", "short-iso", "-n", str(KERNEL_JOURNAL_LINES)]
            output, _, part.error, part.status = _run(argv, timeout=budget.seconds("kernel_log"), cap=10 * cap)
            part.content, part.truncated = _tail(output, cap)
            return
        path = Path(spec)
        part.source = spec
        if not path.exists():
            part.status, part.error = "missing", f"{spec} does not exist"
            return
        if stat.S_ISCHR(path.stat().st_mode):
            part.content, part.truncated = _read_kmsg(spec, cap, time.monotonic() + budget.seconds("kernel_log"))
        else:
            part.content, part.truncated = _tail_file(path, cap)

    return _timed("kernel_log", "kernel.log", collect)


def _samples_part(history: Callable[[], list[bytes]] | None, budget: Budget) -> Part:
    def collect(part: Part) -> None:
        part.source = "the agent's last shipped batches (JSON lines, oldest first)"
        batches = history() if history is not None else []
        if not batches:
            part.status, part.error = "skipped", "the agent has shipped no batch yet"
            return
        part.content, part.truncated = _tail(b"\n".join(batches) + b"\n", budget.cap("agent_samples"))

    return _timed("agent_samples", "agent-samples.jsonl", collect)


def _stacks_part(sources: Sources, budget: Budget) -> Part:
    def collect(part: Part) -> None:
        py_spy = find_py_spy()
        part.source = "py-spy dump --json"
        if py_spy is None:
            part.status, part.error = "missing", "py-spy is not installed"
            return
        targets = sources.targets() if sources.targets is not None else []
        if not targets:
            part.status, part.error = "skipped", "no training processes on the node"
            return
        dumps = []
        for target in targets:
            seconds = min(sources.stack_timeout, budget.seconds("py_spy"))
            if seconds <= 0:
                dumps.append({**target, "error": "no time left in the bundle"})
                continue
            threads, error = dump(int(target["pid"]), py_spy=py_spy, timeout=seconds)
            dumps.append({**target, "threads": threads} if threads is not None else {**target, "error": error})
        failed = [d for d in dumps if "error" in d]
        if failed and len(failed) == len(dumps):
            part.status, part.error = "error", f"no process could be dumped: {failed[0]['error']}"
        elif failed:
            part.error = f"{len(failed)} of {len(dumps)} processes could not be dumped"
        part.content, part.truncated = _tail(orjson.dumps(dumps, option=orjson.OPT_INDENT_2), budget.cap("py_spy"))

    return _timed("py_spy", "py-spy.json", collect)


def _bug_report_part(budget: Budget) -> Part:
    def collect(part: Part) -> None:
        tool = shutil.which("nvidia-bug-report.sh")
        part.source = "nvidia-bug-report.sh --safe-mode --output-file nvidia-bug-report.log"
        if tool is None:
            part.status, part.error = "missing", "nvidia-bug-report.sh is not installed"
            return
        with tempfile.TemporaryDirectory(prefix="faultline-bug-report-") as tmp:
            argv = [tool, "--safe-mode", "--output-file", str(Path(tmp) / "nvidia-bug-report.log")]
            output, _, part.error, part.status = _run(
                argv, timeout=budget.seconds("nvidia_bug_report"), cap=64 * 1024, cwd=tmp
            )
            report = Path(tmp) / "nvidia-bug-report.log.gz"
            if not report.exists():
                if part.status == "ok":
                    part.status, part.error = "error", "it wrote no nvidia-bug-report.log.gz"
                part.error = f"{part.error}: {output[-500:].decode(errors='replace').strip()}"
                return
            cap = budget.cap("nvidia_bug_report")
            part.truncated = report.stat().st_size > cap
            with report.open("rb") as handle:
                part.content = handle.read(cap)  # gzip: a cut one still yields its start (zcat says where it ends)

    return _timed("nvidia_bug_report", "nvidia-bug-report.log.gz", collect)


# -- packing ----------------------------------------------------------------------------------------------


def _pack(manifest: dict[str, Any], parts: list[Part]) -> bytes:
    buffer = io.BytesIO()
    mtime = time.time()
    # Level 6: the bundle is sent once; smaller beats a few CPU-milliseconds.
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        members = [(MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))]
        members += [(p.file, p.content) for p in parts if p.file and p.content]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(mtime)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def collect(
    sources: Sources,
    *,
    bundle_id: str,
    node: str,
    decision_id: int | None,
    timeout_s: float,
    max_bytes: int,
    agent_version: str = "dev",
) -> tuple[bytes, dict[str, Any]]:
    """Collect every part within `timeout_s`, pack them under `max_bytes`: (the tar.gz, its manifest)."""
    started_wall = datetime.now(UTC)
    started = time.monotonic()
    budget = Budget(deadline=started + timeout_s, bytes_left=max(0, max_bytes - RESERVE_BYTES))
    parts: list[Part] = []
    # Cheap and telling first; the slow tools last, with what time is left.
    steps: list[Callable[[], Part]] = [
        lambda: _kernel_part(sources.kmsg, budget),
        lambda: _samples_part(sources.history, budget),
        lambda: _tool_part("nvidia_smi", "nvidia-smi-q.txt", ["nvidia-smi", "-q"], budget),
        lambda: _stacks_part(sources, budget),
        lambda: _tool_part("dcgmi_diag", "dcgmi-diag-r1.txt", ["dcgmi", "diag", "-r", "1"], budget),
        lambda: _bug_report_part(budget),
    ]
    for step in steps:
        part = step()
        budget.bytes_left -= part.bytes
        parts.append(part)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "bundle_id": bundle_id,
        "node": node,
        "decision_id": decision_id,
        "agent_version": agent_version,
        "started_at": started_wall.isoformat(),
        "timeout_s": timeout_s,
        "max_bytes": max_bytes,
    }
    while True:
        manifest["seconds"] = round(time.monotonic() - started, 3)
        manifest["finished_at"] = datetime.now(UTC).isoformat()
        manifest["parts"] = [p.wire() for p in parts]
        body = _pack(manifest, parts)
        if len(body) <= max_bytes:
            break
        # Incompressible parts over the reserve: halve the largest and say so (rare: most parts are text).
        largest = max(parts, key=lambda p: len(p.content))
        if not largest.content:
            raise ValueError(f"a bundle with no content is over {max_bytes} bytes")
        largest.content = largest.content[: len(largest.content) // 2]
        largest.bytes, largest.truncated = len(largest.content), True
    return body, manifest
