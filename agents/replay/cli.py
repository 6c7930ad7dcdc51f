"""`faultline replay`: flags, then a replay into the service of --url, or into one started here for the replay."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents import replay
from agents.replay.client import ReplayClient, ServiceError
from agents.replay.report import format_inputs, format_outcome

# (say) -> a context yielding (url, scheduler-or-operator token, agent token) of a service started for the replay.
LocalService = Callable[[Callable[[str], None]], AbstractContextManager[tuple[str, str, str]]]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a failed run's log files as the nodes of one job and print what faultline decides and why",
        description="Each NODE=FILE[,FILE...] is one node of the job: its kernel log (dmesg, kern.log, journal), "
        "training logs, and optionally a dcgm-exporter scrape. A FILE may start with kernel:, training: or dcgm: "
        "to say what it is (else it is guessed from its lines); a folder stands for its files; a bare FILE is a "
        "node of its own. The agent's own parsers read the files; times in the logs keep their order and are "
        "moved to now. Without --url, a service is started here for the replay (embedded PostgreSQL and Redis "
        "in --data-dir, or the servers of FAULTLINE_DATABASE_URL and FAULTLINE_REDIS_URL).",
    )
    p.add_argument("nodes", nargs="+", metavar="NODE=FILE[,FILE...]", help="a node of the job and its log files")
    p.add_argument("--url", help="a running faultline service (default: start one here)")
    p.add_argument(
        "--token",
        help="a scheduler or operator token of --url, to register the job and read the outcome (or FAULTLINE_TOKEN)",
    )
    p.add_argument("--agent-token", help="an agent token of --url not bound to one node (or FAULTLINE_AGENT_TOKEN)")
    p.add_argument("--job", help="the replayed job's id (default replay-<time>)")
    p.add_argument(
        "--prefix",
        help="put before every node name, so that a replay never names (nor evicts) a real node and starts from "
        "fresh node states (default: the job id and '-'; '' keeps the names)",
    )
    p.add_argument("--timeout", type=float, default=90.0, help="wait at most this long for the outcome, s (90)")
    p.add_argument("--json", type=Path, help="also write the inputs and the outcome as JSON to this file")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".faultline/replay"),
        help="without --url: where the embedded databases and service logs live (default .faultline/replay)",
    )


def _say(message: str) -> None:
    print(f"[replay] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, *, local: LocalService | None = None) -> int:
    """Exit 0 after printing the outcome, 2 when the replay could not be made (the message says why)."""
    try:
        files = replay.plan(args.nodes)
    except replay.ReplayError as exc:
        print(f"faultline replay: {exc}", file=sys.stderr)
        return 2
    job_id = args.job or f"replay-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    prefix = f"{job_id}-" if args.prefix is None else args.prefix
    files = [replay.LogFile(prefix + f.node, f.path, f.kind) for f in files]
    if args.url:
        token = args.token or os.environ.get("FAULTLINE_TOKEN")
        agent_token = args.agent_token or os.environ.get("FAULTLINE_AGENT_TOKEN")
        if not token or not agent_token:
            print(
                "faultline replay: --url needs --token (scheduler or operator) and --agent-token (agent), "
                "or FAULTLINE_TOKEN and FAULTLINE_AGENT_TOKEN",
                file=sys.stderr,
            )
            return 2
        service: AbstractContextManager[tuple[str, str, str]] = contextlib.nullcontext((args.url, token, agent_token))
    elif local is None:
        print(
            "faultline replay: no --url, and this install cannot start a service (pip install "
            "'faultline[server,embedded]')",
            file=sys.stderr,
        )
        return 2
    else:
        service = local(_say)
    try:
        with service as (url, token, agent_token):
            return _replay(args, files, job_id, url, token, agent_token)
    except (ServiceError, replay.ReplayError, RuntimeError, OSError) as exc:
        print(f"faultline replay: {exc}", file=sys.stderr)
        return 2


def _replay(
    args: argparse.Namespace, files: list[replay.LogFile], job_id: str, url: str, token: str, agent_token: str
) -> int:
    loaded = replay.load(files)
    for row in format_inputs(loaded.nodes, loaded.files, loaded.span_s):
        print(row)
    client = ReplayClient(url, token=token, agent_token=agent_token)
    try:
        _say(f"job {job_id} into {url}")
        outcome = replay.run(client, loaded, job_id=job_id, timeout_s=args.timeout, say=_say)
    finally:
        client.close()
    print(f"outcome of job {job_id} after {outcome.waited_s:.0f} s:")
    for row in format_outcome(outcome):
        print(row)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_as_json(loaded, outcome), indent=2, default=str) + "\n")
        _say(f"wrote {args.json}")
    return 0


def _as_json(loaded: replay.Replay, outcome: replay.Outcome) -> dict[str, Any]:
    return {
        "nodes": [
            {"node": n.node, "files": loaded.files.get(n.node, []), "events": len(n.events), "gpus": len(n.readings)}
            for n in loaded.nodes
        ],
        "span_s": round(loaded.span_s, 3),
        **outcome.to_json(),
    }
