"""`faultline replay`: a failed run's log files, replayed as the nodes of one job into a faultline service, and
what it decides about them. A post-mortem tool, and the way to check a new log form before trusting it.

    faultline replay gpu-a=dmesg.txt,train.log gpu-b=kernel:kern.log,dcgm:scrape.prom
    faultline replay gpu-a=gpu-a/ gpu-b=gpu-b/ --url URL --token T --agent-token A
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from agents.replay.client import Outcome, ReplayClient
from agents.replay.timeline import (
    KINDS,
    LogFile,
    NodeReplay,
    ReplayError,
    guess_kind,
    log_text,
    moved_to_now,
    read_node,
)

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass
class Replay:
    """The nodes of one replayed job, with their events moved to now."""

    nodes: list[NodeReplay]
    files: dict[str, list[str]]  # node -> "name (kind)" of each file read
    span_s: float


def _file_spec(token: str) -> tuple[str | None, Path]:
    kind, sep, rest = token.partition(":")
    if sep and kind in KINDS:
        return kind, Path(rest)
    return None, Path(token)


def plan(specs: Sequence[str]) -> list[LogFile]:
    """Files per node from `NODE=FILE[,FILE...]` arguments (a FILE may start with `kernel:`, `training:` or
    `dcgm:`, else its kind is guessed from its lines; a folder stands for its files). A bare FILE is a node of its
    own, named after the file."""
    files: list[LogFile] = []
    for spec in specs:
        node, sep, paths = spec.partition("=")
        if not sep:
            node, paths = re.sub(r"[^A-Za-z0-9._-]", "-", Path(spec.split(":")[-1]).stem).strip("-._") or "node", spec
        if not _NODE_NAME.match(node):
            raise ReplayError(f"{spec!r}: {node!r} is not a node name (letters, digits, '.', '_', '-')")
        for token in filter(None, paths.split(",")):
            kind, path = _file_spec(token)
            inside = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
            if not inside:
                raise ReplayError(f"{path}: an empty folder")
            for item in inside:
                if not item.is_file():
                    raise ReplayError(f"{item}: no such file")
                files.append(LogFile(node, item, kind or guess_kind(log_text(item))))
    if not files:
        raise ReplayError("no files to replay: give NODE=FILE[,FILE...] for each node")
    return files


def load(files: Sequence[LogFile], *, now: datetime | None = None) -> Replay:
    """Parse every node's files and move the timeline to end just before `now`."""
    now = now or datetime.now(UTC)
    by_node: dict[str, list[LogFile]] = {}
    for item in files:
        by_node.setdefault(item.node, []).append(item)
    nodes = [read_node(group, clock=now) for group in by_node.values()]
    span = moved_to_now(nodes, now=now)
    names = {node: [f"{f.path.name} ({f.kind})" for f in group] for node, group in by_node.items()}
    return Replay(nodes, names, span)


def run(
    client: ReplayClient,
    replay: Replay,
    *,
    job_id: str,
    timeout_s: float = 90.0,
    say: Callable[[str], None] = lambda _: None,
) -> Outcome:
    """Register the job, send every node's batches, and wait for the outcome to settle."""
    client.register(job_id, replay.nodes)
    now = datetime.now(UTC)
    for node in replay.nodes:
        sent = client.send(job_id, node, now=now)
        say(f"{node.node}: {len(node.events)} events in {sent} batch{'es' if sent > 1 else ''}")
    say(f"waiting for the worker (at most {timeout_s:.0f} s) ...")
    return client.wait(job_id, timeout_s=timeout_s)


__all__ = ["LogFile", "Outcome", "Replay", "ReplayClient", "ReplayError", "load", "plan", "run"]
