"""`faultline sim`: the simulated cluster from the command line."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from lab.sim.config import RealismParams, SimConfig
from lab.sim.scenarios import SCENARIOS, describe


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sim",
        help="run a simulated GPU cluster (exporters, logs, rank processes, agents) and inject faults",
        description="Simulate a synchronous training job on N nodes and inject a fault scenario. "
        "Ground truth goes to DIR/ground_truth.json.",
    )
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs (ranks) per node (default 8)")
    p.add_argument("--scenario", default="healthy", help=f"one of: {', '.join(SCENARIOS)} (default healthy)")
    p.add_argument("--server", help="faultline API URL the agents ship to")
    p.add_argument("--token", help="agent token (default: env FAULTLINE_AGENT_TOKEN)")
    p.add_argument(
        "--ship-interval",
        "--interval",
        dest="interval",
        type=_positive,
        default=1.0,
        help="seconds between an agent's batches (default 1, so scenarios resolve fast; a real agent's is 5)",
    )
    p.add_argument(
        "--sample-interval",
        type=_positive,
        help="seconds between an agent's GPU samples (default: the agent's, min(1, ship interval))",
    )
    p.add_argument("--fault-after", type=float, default=30.0, help="inject the fault after this many seconds (30)")
    p.add_argument("--fault-every", type=_positive, default=120.0, help="demo: seconds between faults (120)")
    p.add_argument("--duration", type=_positive, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--dir", type=Path, default=Path(".faultline/sim"), help="working folder (.faultline/sim)")
    p.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    p.add_argument("--job-id", help="job id (default sim-<scenario>-<random>)")
    p.add_argument("--node-prefix", default="node-", help="node names are PREFIX000, PREFIX001, ... (default node-)")
    p.add_argument("--step-seconds", type=float, default=1.0, help="seconds per training step (default 1)")
    p.add_argument("--watchdog-seconds", type=_positive, default=20.0, help="scaled NCCL watchdog timeout (20)")
    p.add_argument("--port", type=int, default=0, help="exporter port (default: any free port)")
    p.add_argument("--no-agents", action="store_true", help="endpoints, logs and processes only; no agents")
    p.add_argument(
        "--agent-command",
        help="agent program to run per node, before the per-node flags (default: this Python's `faultline agent`)",
    )
    p.add_argument(
        "--realism",
        action="store_true",
        help="real-life healthy noise: checkpoints, evaluations, restarts, loader stalls, warmup, loss spikes, "
        "node speed, thermal drift, late and restarting agents, clock skew (some scenarios switch it on)",
    )
    p.add_argument(
        "--realism-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one realism rate or size (repeatable), e.g. checkpoint_every_s=120 or checkpoint_s=20,40; "
        "names: " + ", ".join(RealismParams.__dataclass_fields__),
    )
    p.add_argument("--spares", type=int, default=0, help="idle spare nodes the scheduler swaps in (default 0)")
    p.add_argument(
        "--scheduler-token",
        help="act as the job's scheduler: poll the service's decisions with this scheduler token, evict/diagnose "
        "(swap a spare in, restart the job), reset GPUs, ack (default: env FAULTLINE_SCHEDULER_TOKEN; none: off)",
    )
    p.add_argument("--repair-time", type=_positive, default=600.0, help="seconds an evicted node is in repair (600)")
    p.add_argument(
        "--check-time",
        type=_positive,
        default=120.0,
        help="seconds a diagnosed node's checks run (120; at most 180 after its agent's suite starts, inside the "
        "suite's timeouts); with --scheduler-token and agents, its agent's suite measures its simulated GPUs and the "
        "service's verdict settles it; else a placeholder check does",
    )
    p.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    defaults = SimConfig()
    return SimConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        scenario=args.scenario,
        seed=args.seed,
        job_id=args.job_id,
        node_prefix=args.node_prefix,
        step_seconds=args.step_seconds,
        fault_after=args.fault_after,
        fault_every=args.fault_every,
        watchdog_seconds=args.watchdog_seconds,
        duration=args.duration,
        dir=args.dir,
        server=args.server,
        token=args.token or os.environ.get("FAULTLINE_AGENT_TOKEN"),
        interval=args.interval,
        sample_interval=args.sample_interval,
        agents=not args.no_agents,
        agent_command=tuple(shlex.split(args.agent_command)) if args.agent_command else defaults.agent_command,
        port=args.port,
        realism=args.realism,
        spares=args.spares,
        scheduler_token=args.scheduler_token or os.environ.get("FAULTLINE_SCHEDULER_TOKEN"),
        repair_seconds=args.repair_time,
        check_seconds=args.check_time,
        service_checks=bool(args.scheduler_token or os.environ.get("FAULTLINE_SCHEDULER_TOKEN")) and not args.no_agents,
        realism_params=RealismParams().with_overrides(_pairs(args.realism_param)),
    )


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--realism-param wants NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
    if args.list_scenarios:
        print(describe())
        return 0
    problems = []
    if args.scenario not in SCENARIOS:
        problems.append(f"unknown scenario {args.scenario!r}; see --list-scenarios")
    if args.nodes < 1 or args.gpus_per_node < 1:
        problems.append("--nodes and --gpus-per-node must be at least 1")
    if args.spares < 0:
        problems.append("--spares must be >= 0")
    if args.step_seconds < 0.2:
        problems.append("--step-seconds must be at least 0.2")
    if args.fault_after < 0:
        problems.append("--fault-after must be >= 0")
    if args.sample_interval is not None and args.sample_interval > args.interval:
        problems.append("--sample-interval must not be longer than --ship-interval")
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"faultline sim: {e}", file=sys.stderr)
        return 2
    if config.agents and not (config.server and config.token):
        problems.append("agents need --server and --token (or FAULTLINE_AGENT_TOKEN); or pass --no-agents")
    if problems:
        for problem in problems:
            print(f"faultline sim: {problem}", file=sys.stderr)
        return 2
    from lab.sim.runner import run_sim  # the runner pulls in the model; --list-scenarios stays light

    return run_sim(config)


def main(argv: list[str]) -> int:
    """`faultline sim ...`: the CLI hands over the arguments after `sim`, so the product never imports the lab."""
    parser = argparse.ArgumentParser(prog="faultline")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["sim", *argv]))
