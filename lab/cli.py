"""The lab's commands that `faultline` parses itself (`demo`, `bench ingest`, `bench ui`); the others (`sim`,
`eval`, `bench agent|stacks|storage|diagnosis|scale-eval`) parse their own options. The product never imports this."""

from __future__ import annotations

import argparse
import sys

from service.cli import configure_logging


def run(args: argparse.Namespace) -> int:
    configure_logging()
    return {"demo": demo, "bench": bench}[args.command](args)


def demo(args: argparse.Namespace) -> int:
    from lab.demo import run_demo
    from lab.evaluation.soak_config import parse_duration

    problems = []
    duration = None
    if args.duration is not None:
        try:
            duration = parse_duration(args.duration)
        except ValueError as exc:
            problems.append(str(exc).replace("soak duration", "--duration"))
    if args.spares < 0:
        problems.append("--spares must be >= 0")
    if args.repair_time <= 0:
        problems.append("--repair-time must be > 0")
    for problem in problems:
        print(f"faultline demo: {problem}", file=sys.stderr)
    if problems:
        return 2
    return run_demo(
        data_dir=args.data_dir.resolve(),
        port=args.port,
        simulate=not args.no_sim,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        fault_after=args.fault_after,
        fault_every=args.fault_every,
        scheduler=not args.approvals,
        spares=args.spares,
        repair_time=args.repair_time,
        duration=duration,
    )


def bench(args: argparse.Namespace) -> int:
    if args.bench_command == "ui":
        from lab.bench import ui

        return ui.run(args)
    from lab.bench import ingest

    return ingest.run(args)
