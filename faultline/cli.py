"""The `faultline` command. Server commands load the server stack lazily, so the base (agent-only)
install can still run `faultline --help` and, later, `faultline agent`."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from agents import cli as agent_cli
from agents.checks import cli as check_cli
from agents.preflight import cli as preflight_cli
from agents.replay import cli as replay_cli
from agents.schedulers import cli as adapter_cli
from agents.schedulers import slurm_jobs

SCOPES = ("agent", "scheduler", "operator", "admin", "enrol")


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="use the embedded PostgreSQL and Redis of this folder (as `faultline demo` does) "
        "instead of FAULTLINE_DATABASE_URL / FAULTLINE_REDIS_URL",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultline",
        description="Find the machine that breaks a GPU training job, show the evidence, tell the scheduler.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="run everything locally: PostgreSQL, Redis, API, worker, beat, traffic")
    demo.add_argument("--port", type=int, default=8080, help="API port (default 8080)")
    demo.add_argument("--data-dir", type=Path, default=Path(".faultline"), help="where data lives (default .faultline)")
    demo.add_argument("--no-sim", action="store_true", help="services only, for pointing real agents at it")
    demo.add_argument("--nodes", type=int, default=8, help="simulated nodes (default 8)")
    demo.add_argument("--gpus-per-node", type=int, default=8)
    demo.add_argument("--fault-after", type=float, default=60.0, help="first simulated fault after this many s (60)")
    demo.add_argument("--fault-every", type=float, default=180.0, help="then a fault every this many s (180)")
    demo.add_argument(
        "--approvals",
        action="store_true",
        help="no scheduler stand-in: decisions wait for a person (approve, reject) or an adapter you run",
    )
    demo.add_argument("--spares", type=int, default=2, help="spare nodes the stand-in swaps in (default 2)")
    demo.add_argument("--repair-time", type=float, default=300.0, help="s an evicted node is in repair (300)")
    demo.add_argument(
        "--duration", help="stop after this long (e.g. 30m, 1h) and print a summary of the run (default: Ctrl-C)"
    )

    serve = sub.add_parser("serve", help="run the API (uvicorn)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1, help="API processes (default 1)")
    _data_dir_option(serve)

    work = sub.add_parser("work", help="run a Celery worker (and/or the beat scheduler)")
    mode = work.add_mutually_exclusive_group()
    mode.add_argument("--beat", action="store_true", help="also run the periodic scheduler in this worker")
    mode.add_argument("--beat-only", action="store_true", help="run only the periodic scheduler")
    work.add_argument("--queues", default=None, help="comma-separated queues (default: all)")
    work.add_argument("--concurrency", type=int, default=None)
    _data_dir_option(work)

    migrate = sub.add_parser("migrate", help="apply database migrations (alembic upgrade head)")
    migrate.add_argument("--check", action="store_true", help="only report whether the database is up to date")
    _data_dir_option(migrate)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_sub.add_parser("create", help="create a token and print it (shown once)")
    create.add_argument("--scope", required=True, choices=SCOPES)
    create.add_argument("--node", help="bind an agent token to one node name")
    create.add_argument(
        "--node-pattern", help="an enrolment token enrols only node names matching this shell pattern, e.g. 'gpu-*'"
    )
    create.add_argument("--name", help="a label for listings")
    create.add_argument("--ttl-days", type=float, help="expire after this many days")
    _data_dir_option(create)
    listing = token_sub.add_parser("list", help="list tokens (never their values)")
    _data_dir_option(listing)
    revoke = token_sub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id", type=int)
    _data_dir_option(revoke)

    breaker = sub.add_parser(
        "breaker",
        help="the fleet circuit breaker: its state, or a person's reset that resumes automatic take-outs",
    )
    breaker_sub = breaker.add_subparsers(dest="breaker_command", required=True, metavar="ACTION")
    breaker_status = breaker_sub.add_parser("status", help="closed or tripped, why, and what is out now")
    breaker_status.add_argument("--json", action="store_true", help="print the API's JSON instead of text")
    _data_dir_option(breaker_status)
    breaker_reset = breaker_sub.add_parser("reset", help="resume automatic take-outs after a trip (audited)")
    breaker_reset.add_argument("--reason", required=True, help="why automation may resume (kept in the audit trail)")
    breaker_reset.add_argument(
        "--by", help="who resets it, for the audit trail (default: operator:cli:$USER)", default=None
    )
    _data_dir_option(breaker_reset)

    backtest = sub.add_parser(
        "backtest",
        help="replay stored incidents through another policy and say what it would decide differently (read-only)",
        description="Replay the findings of the incidents opened in the window, in the order they were stored, "
        "through the current policy and through the candidate (the real demarcation and policy code), and print "
        "per incident what was decided, what the candidate would decide and why it differs, then totals. It never "
        "writes: it reads in a READ ONLY transaction that is rolled back. The same input gives the same output.",
    )
    backtest.add_argument(
        "--policy",
        type=Path,
        required=True,
        metavar="FILE",
        help="TOML (.toml) or JSON file of policy settings overriding the current ones, by the names of the "
        "FAULTLINE_POLICY_* settings (e.g. policy_evict_min_confidence = 0.9)",
    )
    backtest.add_argument("--since", default="7d", help="incidents opened this long before --until (default 7d)")
    backtest.add_argument("--until", help="end of the window, ISO 8601 (default: now)")
    backtest.add_argument("--job", action="append", default=[], metavar="JOB", help="only this job (repeatable)")
    backtest.add_argument("--json", type=Path, metavar="PATH", help="also write the result as JSON to this file")
    _data_dir_option(backtest)

    _maintenance_parser(sub)

    agent_cli.add_parser(sub)
    check_cli.add_parser(sub)
    preflight_cli.add_parser(sub)
    replay_cli.add_parser(sub)
    sub.add_parser(
        "sim",
        help="run a simulated GPU cluster (exporters, logs, rank processes, agents) and inject faults; "
        "`sim preflight`: the preflight over a simulated allocation with three faults planted",
        add_help=False,
    )
    adapter_cli.add_parser(sub)
    slurm_jobs.add_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    ingest = bench_sub.add_parser("ingest", help="drive the HTTP ingest API with agent-shaped batches")
    ingest.add_argument("--nodes", type=int, default=2048)
    ingest.add_argument("--gpus-per-node", type=int, default=8)
    ingest.add_argument(
        "--ship-interval",
        "--interval",
        type=float,
        default=5.0,
        help="seconds between a node's batches (default 5, the agent's)",
    )
    ingest.add_argument(
        "--sample-interval", type=float, default=1.0, help="seconds between a GPU's samples in a batch (default 1)"
    )
    ingest.add_argument("--duration", type=float, default=60.0, help="seconds of paced load")
    ingest.add_argument("--capacity-seconds", type=float, default=15.0, help="seconds of unpaced load after it")
    ingest.add_argument("--api-workers", type=int, default=2, help="API processes to start")
    ingest.add_argument("--connections", type=int, default=256, help="concurrent HTTP connections")
    ingest.add_argument("--no-worker", action="store_true", help="do not run a Celery worker alongside")
    ingest.add_argument("--json", type=Path, help="also write the figures to this file")
    _data_dir_option(ingest)
    ui = bench_sub.add_parser("ui", help="time every web UI page at 2,048 nodes and 3,000 incidents")
    ui.add_argument("--nodes", type=int, default=2048)
    ui.add_argument("--incidents", type=int, default=3000)
    ui.add_argument("--open-incidents", type=int, default=60, help="of those, still open")
    ui.add_argument("--rounds", type=int, default=10, help="requests per page")
    ui.add_argument("--json", type=Path, help="also write the figures to this file")
    _data_dir_option(ui)
    bench_sub.add_parser(
        "agent",
        help="the agent's CPU, RSS, requests/s and bytes per sample on a busy 8-GPU node (see --help)",
        add_help=False,
    )
    # Commands with their own argument parsers; listed here for --help, dispatched by `main` (see _PASSTHROUGH).
    bench_sub.add_parser("stacks", help="stack aggregation over 16,384 synthetic ranks (see --help)", add_help=False)
    bench_sub.add_parser(
        "storage", help="bytes per GPU-sample and retention time, partition drop vs DELETE (see --help)", add_help=False
    )
    bench_sub.add_parser("diagnosis", help="diagnosis passes of a 1,024 to 16,384-GPU job (see --help)", add_help=False)
    bench_sub.add_parser(
        "scale-eval",
        help="time from an injected fault (straggler, fatal Xid) to the decision on a 16,384-GPU job (see --help)",
        add_help=False,
    )
    sub.add_parser(
        "ml",
        help="the log classifier: `faultline ml train` (versioned artifact), `faultline ml predict LINE`",
        add_help=False,
    )
    sub.add_parser("eval", help="run the scenario suite: precision, recall, time to decision", add_help=False)
    return parser


def _maintenance_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    maintenance = sub.add_parser(
        "maintenance",
        help="announce, list and cancel nodes' planned maintenance windows",
        description="A window's node is drained (and its job asked to checkpoint) FAULTLINE_MAINTENANCE_LEAD_S ahead, "
        "its going down is no fault, and it comes back through the return gate after it.",
    )
    action = maintenance.add_subparsers(dest="maintenance_command", required=True, metavar="ACTION")
    announce = action.add_parser("announce", help="announce a node's window")
    announce.add_argument("node")
    announce.add_argument("--start", required=True, help="ISO 8601 time (no zone: UTC), or +DURATION from now (+30m)")
    end = announce.add_mutually_exclusive_group(required=True)
    end.add_argument("--end", help="ISO 8601 time (no zone: UTC)")
    end.add_argument("--duration", help="length from the start: 2h, 90m")
    announce.add_argument("--reason", required=True, help="the work, a ticket")
    _data_dir_option(announce)
    listing = action.add_parser("list", help="windows, newest first")
    listing.add_argument("--node", help="only this node's")
    listing.add_argument("--current", action="store_true", help="only windows not over nor cancelled")
    _data_dir_option(listing)
    cancel = action.add_parser("cancel", help="cancel a window (a node it drained goes back through its return gate)")
    cancel.add_argument("node")
    cancel.add_argument("window_id", type=int)
    _data_dir_option(cancel)


# Prefix of argv -> "module:function" taking the rest of argv: commands that parse their own options.
_PASSTHROUGH: dict[tuple[str, ...], str] = {
    ("ml",): "ml.classifier.cli:main",  # takes `train ...` / `predict ...` itself
    ("bench", "stacks"): "lab.bench.stacks:main",
    ("bench", "storage"): "lab.bench.storage:main",
    ("bench", "diagnosis"): "lab.bench.diagnosis:main",
    ("bench", "scale-eval"): "lab.bench.scale_eval:main",
    ("eval",): "lab.evaluation.cli:main",
    ("sim", "preflight"): "lab.sim.preflight:main",  # before ("sim",): the longest prefix first
    ("sim",): "lab.sim.cli:main",
    ("bench", "agent"): "lab.bench.agent:main",
}


def _needs(module_name: str, exc: ImportError) -> str:
    extra = "lab" if module_name.startswith("lab.") else "server"
    return f"needs {exc.name or 'a module'} ({extra} stack): pip install 'faultline[{extra}]'"


def _passthrough(argv: list[str]) -> int | None:
    for prefix, target in _PASSTHROUGH.items():
        if tuple(argv[: len(prefix)]) == prefix:
            module_name, function = target.split(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                print(f"faultline {' '.join(prefix)} {_needs(module_name, exc)}", file=sys.stderr)
                return 2
            return int(getattr(module, function)(argv[len(prefix) :]))
    return None


def _local_service(data_dir: Path) -> replay_cli.LocalService | None:
    """The service `faultline replay` starts for itself; None on an install without the server stack."""
    try:
        from service.stack import local_service
    except ImportError:
        return None
    return lambda say: local_service(data_dir, say)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passed = _passthrough(argv)
    if passed is not None:
        return passed
    args = build_parser().parse_args(argv)
    if args.command == "agent":
        return agent_cli.run(args)
    if args.command == "check":
        return check_cli.run(args)
    if args.command == "preflight":
        return preflight_cli.run_command(args)
    if args.command == "adapter":
        return adapter_cli.run(args)
    if args.command == "slurm":
        return slurm_jobs.run(args)
    if args.command == "replay":
        return replay_cli.run(args, local=None if args.url else _local_service(args.data_dir))
    if args.command in ("demo", "bench"):  # the lab's own commands, imported only when asked for
        try:
            from lab import cli as lab_cli
        except ImportError as exc:
            print(f"faultline {args.command} {_needs('lab.cli', exc)}", file=sys.stderr)
            return 2
        return lab_cli.run(args)
    try:
        from service import cli as server_cli
    except ImportError as exc:
        print(
            f"faultline {args.command} needs the server stack ({exc.name} is missing): pip install 'faultline[server]'",
            file=sys.stderr,
        )
        return 2
    return server_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
