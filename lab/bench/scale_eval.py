"""`faultline bench scale-eval`: from an injected fault to the right decision, on a 16,384-GPU job.

The real service runs as child processes, as in production: the API (`faultline serve`), a Celery worker
and beat (`faultline work`; beat's periodic pass is what finds a straggler, ingest's trigger what diagnoses
a fatal Xid at once). Each scenario registers a fresh job through the jobs API (2,048 nodes x 8 GPUs by
default, one tensor-parallel group per node) and drives it with the load generator process
(lab/bench/loadgen.py), which speaks the agent protocol over HTTP: every node samples its GPUs every
second and ships every five, the first node logs training steps. After a healthy period the load generator
injects one fault on one GPU of one node:

- straggler: the GPU throttles thermally (clock, power, temperature), and every training step slows;
- xid: a fatal Xid 79 kernel line (GPU fallen off the bus), sent at once as an agent sends a critical
  event; the GPU's series stop.

A scheduler's long poll on the decisions API sees the decision; the time to decision runs from the
injection to that moment. Targets: Xid decided within 5 s, straggler within 3 min, and no healthy node
accused (no decision, and no incident suspect, naming any other node, before or after the fault).
Thresholds are the service's own: nothing here tunes them.

Exit code: 0 when every scenario passes, 1 when one fails, 2 when the run could not be set up, 130 when
interrupted. Progress lines go to stderr, the table to stdout, `--json` writes everything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import queue
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from lab.bench.backend import create_token, start_backend, start_service
from lab.bench.busy import OtherLoad, note, watch_other_load
from lab.bench.loadgen_protocol import LoadConfig, samples_per_batch
from lab.bench.scale_eval_report import Outcome, _report, _verdict_line, format_table
from lab.bench.scale_eval_watch import Context, DecisionWatch, LoadRun, PassLog, register_job
from lab.evaluation.records import NOT_EVICTING_STATES, Decision, parse_decisions, parse_incidents, parse_time
from service.arguments import non_negative, positive, positive_int
from service.config import to_libpq_url

# Scenarios run in this order by default: the job of a finished scenario stays "active" (diagnosed by beat)
# for FAULTLINE_ACTIVE_JOB_S after its load stops, so the short Xid scenario goes first and its leftover
# passes fall in the straggler's healthy period rather than on the Xid's five seconds.
DEFAULT_ORDER = ("xid", "straggler")
FAULT_GPU = 3
# After a scenario's target, how much longer to wait for a late decision (to say how late it is).
LATE_GRACE_S = 60.0
POLL_WAIT_S = 2.0  # one long poll; short, so that load generator events are handled promptly
PROGRESS_S = 15.0
# The load generator must not run out before the watch ends; the watch stops it.
LOAD_MARGIN_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str  # a loadgen fault
    target_s: float
    description: str
    # Decisions about the broken node that answer the fault (in any state but rejected).
    right_kinds: frozenset[str]


SCENARIOS: dict[str, Scenario] = {
    # A fail-slow GPU seen in its DCGM counters alone is the policy's "run diagnostics on it" (faultline eval
    # counts the first decision naming a node the same way); stack rounds are what raise it to an eviction,
    # and the load generator has no processes to dump. The report shows which kind came.
    "straggler": Scenario(
        "straggler", "straggler", 180.0, "thermal straggler (one GPU throttled)", frozenset({"evict", "diagnose"})
    ),
    # The Xid catalog says a GPU fallen off the bus needs the machine out: only an eviction answers it.
    "xid": Scenario("xid", "xid", 5.0, "fatal Xid 79 (GPU fallen off the bus)", frozenset({"evict"})),
}


def _say(message: str) -> None:
    print(f"[scale-eval] {message}", file=sys.stderr, flush=True)


class SetupError(Exception):
    """The run cannot start (exit code 2); the message says why."""


# --- the command line ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="faultline bench scale-eval",
        description="Inject a fault into a synthetic 16,384-GPU job driven through the real API, worker and beat; "
        "time the right decision and check that no healthy node is accused.",
    )
    p.add_argument("--nodes", type=positive_int, default=2048, help="nodes of the job (default 2048)")
    p.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node (default 8)")
    p.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_ORDER),
        help=f"comma-separated, run in this order (default {','.join(DEFAULT_ORDER)}): {', '.join(SCENARIOS)}",
    )
    p.add_argument("--healthy", type=positive, default=60.0, help="seconds of healthy load before the fault (60)")
    p.add_argument("--settle", type=non_negative, default=15.0, help="seconds watched after the decision (15)")
    p.add_argument("--fault-node", type=int, help="index of the node to break (default: two thirds into the job)")
    p.add_argument("--sample-interval", type=positive, default=1.0, help="seconds between a GPU's samples (1)")
    p.add_argument("--ship-interval", type=positive, default=5.0, help="seconds between a node's batches (5)")
    p.add_argument("--api-workers", type=positive_int, default=2, help="API processes (default 2)")
    p.add_argument("--worker-concurrency", type=positive_int, default=2, help="Celery worker processes (default 2)")
    p.add_argument("--connections", type=positive_int, default=256, help="load generator connections (256)")
    p.add_argument("--json", type=Path, help="also write everything to this file")
    p.add_argument(
        "--data-dir",
        type=Path,
        help="use the embedded PostgreSQL and Redis of this folder instead of FAULTLINE_DATABASE_URL / "
        "FAULTLINE_REDIS_URL (with neither: throwaway embedded servers)",
    )
    return p


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios asked for, or SetupError naming what is wrong with the arguments."""
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    problems = [f"unknown scenario {', '.join(unknown)} (known: {', '.join(SCENARIOS)})"] if unknown else []
    if not names:
        problems.append("no scenario to run")
    if len(set(names)) != len(names):
        problems.append("a scenario is named twice")
    if args.nodes < 2:
        problems.append("--nodes must be at least 2: with one node there is no healthy one to keep")
    if args.fault_node is not None and not 0 <= args.fault_node < args.nodes:
        problems.append(f"--fault-node must be between 0 and {args.nodes - 1}")
    if args.gpus_per_node <= FAULT_GPU:
        problems.append(f"--gpus-per-node must be more than {FAULT_GPU}: the fault is on GPU {FAULT_GPU}")
    try:
        samples_per_batch(args.ship_interval, args.sample_interval)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise SetupError("; ".join(problems))
    return [SCENARIOS[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    try:
        scenarios = _scenarios(args)
    except SetupError as exc:
        _say(f"error: {exc}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="faultline-scale-eval-"))
    # A plain kill must stop the children too, as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    outcomes: list[Outcome] = []
    watched: list[OtherLoad] = []
    try:
        with contextlib.ExitStack() as stack:
            context = _setup(args, workdir, stack)
            dsn = to_libpq_url(context.service.env["FAULTLINE_DATABASE_URL"])
            with watch_other_load(dsn) as watched:
                for scenario in scenarios:
                    outcomes.append(run_scenario(context, scenario))
                    _say(_verdict_line(outcomes[-1]))
    except SetupError as exc:
        _say(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        _clean(workdir, keep_logs=not outcomes or not all(o.passed for o in outcomes))
    print(format_table(outcomes, args))
    report = _report(outcomes, args)
    print(note(report, watched))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        _say(f"figures written to {args.json}")
    return 0 if all(o.passed for o in outcomes) else 1


def _clean(workdir: Path, *, keep_logs: bool) -> None:
    """Remove the run's folder; keep the service's logs when something failed."""
    logs = workdir / "logs"
    if keep_logs and logs.is_dir() and any(logs.iterdir()):
        for name in ("postgres", "redis", "prometheus"):
            shutil.rmtree(workdir / name, ignore_errors=True)
        _say(f"logs kept in {logs}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


# --- the service --------------------------------------------------------------------------------------------


def _setup(args: argparse.Namespace, workdir: Path, stack: contextlib.ExitStack) -> Context:
    import psycopg
    from sqlalchemy.exc import SQLAlchemyError

    from service import migrate

    try:
        backend = start_backend(args.data_dir, workdir, stack)
        _say(f"database: {backend.kind}; applying migrations ...")
        migrate.upgrade(backend.database_url)
        agent = create_token(stack, scope="agent", name="bench-scale-eval")
        scheduler = create_token(stack, scope="scheduler", name="bench-scale-eval")
        # INFO: the worker logs each pass and its duration, which the report reads.
        service = start_service(
            backend,
            workdir,
            stack,
            api_workers=args.api_workers,
            worker_concurrency=args.worker_concurrency,
            beat=True,
            log_level="INFO",
        )
    except (RuntimeError, OSError, SQLAlchemyError, psycopg.Error) as exc:
        raise SetupError(f"could not start the service: {exc}") from None
    return Context(args, service, agent, scheduler, secrets.token_hex(2))


# --- one scenario -------------------------------------------------------------------------------------------


def _fault_node(args: argparse.Namespace) -> int:
    # Not node 0 (it logs the job's steps) and not at either end of the name order.
    return args.fault_node if args.fault_node is not None else args.nodes * 2 // 3


def run_scenario(context: Context, scenario: Scenario) -> Outcome:
    args = context.args
    job_id = f"scale-{scenario.name}-{context.run_id}"
    prefix = f"{scenario.name}-{context.run_id}-node"
    node = f"{prefix}-{_fault_node(args):04d}"
    outcome = Outcome(scenario.name, scenario.description, job_id, args.nodes, node, scenario.target_s)
    watch_s = scenario.target_s + LATE_GRACE_S + args.settle
    config = LoadConfig(
        host="127.0.0.1",
        port=context.service.port,
        token=context.agent_token,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        ship_interval=args.ship_interval,
        sample_interval=args.sample_interval,
        duration=args.healthy + watch_s + LOAD_MARGIN_S,
        connections=args.connections,
        capacity_seconds=0,
        job_id=job_id,
        node_prefix=prefix,
        fault=scenario.fault,
        fault_node=_fault_node(args),
        fault_gpu=FAULT_GPU,
        fault_after=args.healthy,
        progress_s=PROGRESS_S,
    )
    _say(
        f"{scenario.name}: job {job_id}, {args.nodes:,} nodes x {args.gpus_per_node} GPUs; {scenario.description} on "
        f"{node} GPU {FAULT_GPU} after {args.healthy:g} s of healthy load; target {scenario.target_s:g} s"
    )
    passes = PassLog(context.service.logs / "worker.log")
    watch = DecisionWatch(context.service.url, context.scheduler_token, job_id)
    try:
        register_job(
            context.service.url,
            context.scheduler_token,
            job_id=job_id,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
        )
        with contextlib.ExitStack() as stack:
            load = LoadRun(config, context, stack)
            try:
                _watch(context, scenario, outcome, load, watch, passes)
            finally:
                load.stop()
            if load.error:
                raise RuntimeError(load.error)
            outcome.load = _load_figures(load.result, args)
        _collect(outcome, scenario, watch)
    except RuntimeError as exc:
        outcome.error = str(exc)
    finally:
        watch.close()
    passes.read()
    outcome.passes = passes.summary(job_id)
    return outcome


def _watch(
    context: Context, scenario: Scenario, outcome: Outcome, load: LoadRun, watch: DecisionWatch, passes: PassLog
) -> None:
    """Until the right decision plus the settle time, or the target plus LATE_GRACE_S, or the load's end."""
    started = time.monotonic()
    injected: float | None = None  # wall clock, as decisions are stamped
    answered = False
    stop_at: float | None = None
    next_progress = started + PROGRESS_S
    while load.running:
        for decision in watch.poll(POLL_WAIT_S):
            _say(f"{scenario.name}: decision {decision['kind']} {decision['node'] or '(job)'} ({decision['state']})")
            answered = answered or _is_right(decision, scenario, outcome.node_injected)
        # The injection event may come after the decision it caused: the poll above waits.
        injected = _drain(load, outcome) or injected
        if injected is not None and stop_at is None:
            stop_at = injected + scenario.target_s + LATE_GRACE_S + context.args.settle
        if injected is not None and answered:
            stop_at = min(stop_at or math.inf, time.time() + context.args.settle)
            answered = False  # the settle time runs from the first right decision
        context.service.check()
        now = time.monotonic()
        if now >= next_progress:
            passes.read()
            _say(_progress(scenario, outcome, now - started, injected, passes, len(watch.seen)))
            next_progress = now + PROGRESS_S
        if stop_at is not None and time.time() >= stop_at:
            return
    if load.error is None:
        raise RuntimeError("the load generator ended before the scenario did")


def _drain(load: LoadRun, outcome: Outcome) -> float | None:
    """Handle the load generator's events; the injection time (epoch seconds) when it came."""
    injected = None
    while True:
        try:
            event = load.events.get_nowait()
        except queue.Empty:
            return injected
        if event.get("event") == "injected":
            outcome.injected_at = event["at"]
            stamp = parse_time(event["at"])
            injected = stamp.timestamp() if stamp else time.time()
            _say(f"{outcome.scenario}: injected {event['fault']} on {event['node']} GPU {event['gpu']}")
        elif event.get("event") == "paced_start":
            _say(f"{outcome.scenario}: warm-up done, paced load started")


def _is_right(decision: dict[str, Any] | Decision, scenario: Scenario, node: str) -> bool:
    parsed = Decision.from_api(decision) if isinstance(decision, dict) else decision
    return (
        parsed is not None
        and parsed.kind in scenario.right_kinds
        and parsed.state not in NOT_EVICTING_STATES
        and parsed.node == node
    )


def _progress(
    scenario: Scenario, outcome: Outcome, elapsed: float, injected: float | None, passes: PassLog, decisions: int
) -> str:
    since = f"injected {time.time() - injected:.0f} s ago" if injected is not None else "healthy"
    mine = passes.summary(outcome.job_id)
    last = f", p50 {mine['p50_s']} s, max {mine['max_s']} s" if mine["count"] else ""
    return (
        f"{scenario.name}: {elapsed:.0f} s, {since}; decisions {decisions}; diagnosis passes of this job "
        f"{mine['count']}{last}; of other jobs {mine['other_jobs_count']}"
    )


def _collect(outcome: Outcome, scenario: Scenario, watch: DecisionWatch) -> None:
    """Every decision and incident of the job: who was decided on, who was accused, when it was stamped."""
    watch.poll(0)
    items = [item for _, item in sorted(watch.seen.values(), key=lambda seen: seen[1]["id"])]
    outcome.decisions = items
    for decision in parse_decisions(items):
        if decision.node is not None:
            outcome.decided.setdefault(decision.node, []).append(f"{decision.kind} ({decision.state})")
    injected = parse_time(outcome.injected_at)
    right = [
        d
        for d in parse_decisions(items)
        if _is_right(d, scenario, outcome.node_injected) and not _before(d.created_at, injected)
    ]
    if right and injected is not None:
        seen = watch.seen[right[0].id][0]
        outcome.time_to_decision_s = round(seen - injected.timestamp(), 2)
        outcome.answer = right[0].kind
        if right[0].created_at is not None:
            outcome.decision_stamped_after_s = round((right[0].created_at - injected).total_seconds(), 2)
    incidents = watch.incidents()
    outcome.incidents = incidents
    found = parse_incidents(incidents)
    suspects = {node for incident in found for node, _ in incident.suspects}
    accused = (set(outcome.decided) | suspects) - {outcome.node_injected}
    # Before the fault every node is healthy, the one about to break included.
    accused |= {d.node for d in parse_decisions(items) if d.node and _before(d.created_at, injected)}
    accused |= {node for i in found if _before(i.opened_at, injected) for node, _ in i.suspects}
    outcome.accused = sorted(accused)


def _before(stamp: datetime | None, injected: datetime | None) -> bool:
    """Stamped before the fault (all of the run counts as before when the fault never came)."""
    return stamp is not None and (injected is None or stamp < injected)


def _load_figures(result: dict[str, Any] | None, args: argparse.Namespace) -> dict[str, Any]:
    """How the ingest path held up during the scenario (a slow API delays every signal)."""
    if result is None:
        return {}
    paced = result.get("paced", {})
    offered = args.nodes * args.gpus_per_node / args.sample_interval
    return {
        "warmup_s": result.get("warmup", {}).get("elapsed_s"),
        "paced_s": paced.get("elapsed_s"),
        "sustained_ratio": round(paced.get("samples_per_s", 0.0) / offered, 3),
        "latency_ms": paced.get("latency_ms"),
        "non_2xx": paced.get("non_2xx"),
        "errors": paced.get("errors"),
        "directives": paced.get("directives"),
        "critical_request": (result.get("injection") or {}).get("request"),
        "cpu_cores": result.get("cpu_cores", {}).get("paced", {}),
    }
