"""`faultline eval`: run the scenario suite against a real service and score its decisions.

Starts what `faultline demo` starts (embedded PostgreSQL and Redis, or the servers of FAULTLINE_DATABASE_URL and
FAULTLINE_REDIS_URL; migrations; the API, a Celery worker and beat), then runs each scenario: a simulated
cluster (`faultline sim`) or a real torchrun job with real agents, registered first with a short hang timeout.
It watches the decisions API for each job until the scenario's deadline, stops the job, and scores: machine-level
precision and recall of evictions, blame, time from the fault to the first decision, and the targets.

Exit code: 0 when every target is met, 1 when one is not, 2 when the eval could not be set up, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from lab.evaluation import calibration, spread
from lab.evaluation.records import GroundTruth
from lab.evaluation.report import concurrent_faults, format_summary, format_table
from lab.evaluation.scenarios import CATALOG, TORCH, parse_selection
from lab.evaluation.scoring import FAIL, PASS, Target, summarize
from lab.evaluation.soak_config import DEFAULT_JOBS_SPEC
from service.arguments import positive, positive_int
from service.config import Settings

CAMPAIGN_JOBS_SPEC = "4x2:tp2"  # lab/evaluation/campaign.py's default (not imported: it loads the simulator)
CAMPAIGN_FAULTS = 200
CAMPAIGN_HANG_TIMEOUT_S = 90

DEFAULT_DATA_DIR = Path(".faultline/eval")
# The repo's corpus of real logs (lab/evaluation/corpus.py's default; not imported: it loads the agent's parsers).
CORPUS_DEFAULT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "logs"
CORPUS_PARALLEL = 8


class SetupError(Exception):
    """The eval cannot run (exit code 2); the message says why."""


_print_lock = threading.Lock()


def say(message: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    with _print_lock, contextlib.suppress(OSError, ValueError):
        print(f"[eval] {message}", file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = ", ".join(CATALOG)
    p.add_argument("--scenarios", help=f"comma-separated scenarios (default: all): {names}")
    p.add_argument("--repeat", type=positive_int, default=1, help="run each scenario with N seeds (default 1)")
    p.add_argument("--seed", type=int, default=1, help="first seed (default 1); then seed+1, ...")
    p.add_argument("--nodes", type=positive_int, default=4, help="simulated nodes (default 4)")
    p.add_argument("--gpus-per-node", type=positive_int, default=4, help="simulated GPUs per node (default 4)")
    p.add_argument(
        "--tp", type=positive_int, default=1, help="sim: tensor-parallel size registered with each job (default 1)"
    )
    p.add_argument(
        "--pp", type=positive_int, default=1, help="sim: pipeline stages registered with each job (default 1)"
    )
    p.add_argument("--parallel", type=positive_int, default=1, help="scenarios run at once (default 1)")
    p.add_argument("--fault-after", type=positive, default=30.0, help="sim: inject after this many s (30)")
    p.add_argument(
        "--hang-timeout",
        type=int,
        default=None,
        help="hang timeout registered with each job, seconds (default 30; the campaign's 90, above its jobs' "
        "checkpoint pauses and restarts)",
    )
    p.add_argument(
        "--healthy-duration", type=positive, default=180.0, help="how long a healthy run is watched, s (180)"
    )
    p.add_argument("--no-torch", action="store_true", help="skip the real torchrun scenarios")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"embedded databases, logs and scenario folders (default {DEFAULT_DATA_DIR})",
    )
    p.add_argument("--json", type=Path, help="write everything as JSON here (default DATA/eval.json)")
    p.add_argument("--port", type=int, default=0, help="API port (default: any free port)")
    p.add_argument("--keep", action="store_true", help="keep every scenario's folder (default: only failed ones)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument(
        "--soak",
        metavar="DURATION",
        help="instead of the scenarios: healthy jobs with real-life noise for DURATION of simulated time (e.g. 24h), "
        "in accelerated time; reports every finding, incident and decision (see README)",
    )
    p.add_argument(
        "--soak-jobs",
        default=DEFAULT_JOBS_SPEC,
        help=f"the soak's jobs, run at once: NODESxGPUS[:tpTppP],... (default {DEFAULT_JOBS_SPEC})",
    )
    p.add_argument(
        "--soak-processes",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="processes the soak's (or the campaign's) jobs are spread over (default: one per CPU)",
    )
    p.add_argument(
        "--campaign",
        action="store_true",
        help="instead of the scenarios: one long-lived service, faults back to back from the Llama 3 405B mix on "
        "long-running jobs, the closed loop acting on decisions, in accelerated time (see README)",
    )
    p.add_argument(
        "--faults", type=positive_int, default=CAMPAIGN_FAULTS, help=f"campaign: faults (default {CAMPAIGN_FAULTS})"
    )
    p.add_argument(
        "--duration",
        metavar="DURATION",
        help="campaign: a bound on the simulated time (e.g. 12h; default: enough for every fault)",
    )
    p.add_argument(
        "--campaign-placeholder-checks",
        action="store_true",
        help="campaign: a machine sent to diagnose is settled by the placeholder check, not by the service's verdict "
        "on the stop-time checks it answers (the baseline before issue 28)",
    )
    p.add_argument(
        "--corpus",
        nargs="?",
        type=Path,
        const=CORPUS_DEFAULT,
        metavar="DIR",
        help="instead of the scenarios: every labeled real log of DIR (default: the repo's corpus, "
        "tests/fixtures/logs) end to end, each as one node of a job beside an innocent peer; right or wrong per "
        "log and per class, and how often the innocent node was accused",
    )
    p.add_argument(
        "--shared-rate",
        type=share,
        default=0.0,
        metavar="SHARE",
        help="campaign: the share of faults drawn as a shared component's fault instead (a leaf switch down, a bad "
        "driver rollout, a storage outage, a rack's power lost, in turn), e.g. 0.03 (default 0: none)",
    )
    p.add_argument(
        "--campaign-jobs",
        default=CAMPAIGN_JOBS_SPEC,
        help=f"the campaign's jobs, run at once: NODESxGPUS[:tpTppP],... (default {CAMPAIGN_JOBS_SPEC})",
    )
    p.add_argument(
        "--chaos",
        action="store_true",
        help="campaign: the service as its own processes (API, worker, embedded PostgreSQL and Redis), the agents "
        "shipping over HTTP through their spool, and those processes killed and restarted at random moments (seeded "
        "by --seed); prints batches sent and stored, duplicate decisions, and recall and times beside --calm's",
    )
    p.add_argument(
        "--chaos-blows",
        type=positive_int,
        metavar="N",
        help="--chaos: processes killed over the campaign, the worker, the API, Redis and PostgreSQL in turn "
        "(default: one per 4 faults, at least 4)",
    )
    p.add_argument(
        "--calm",
        type=Path,
        metavar="CAMPAIGN_JSON",
        help="--chaos: a calm campaign's JSON (same --faults and --seed), its figures printed beside the chaos run's",
    )
    p.add_argument(
        "--project-ettr",
        type=Path,
        metavar="CAMPAIGN_JSON",
        help="instead of a run: the projected ETTR of a 16,384-GPU job at Llama 3's fault rate from a saved "
        "campaign's measured times (lab/evaluation/ettr_projection.py), with the assumptions below",
    )
    defaults = ettr_assumptions_defaults()
    for flag, key, what in (
        ("--restart-s", "restart_s", "a restart of the whole job, seconds"),
        ("--checkpoint-interval-s", "checkpoint_interval_s", "seconds between checkpoints"),
        ("--checkpoint-save-s", "checkpoint_save_s", "training paused per checkpoint save, seconds"),
        ("--spare-wait-s", "spare_wait_s", "waiting for a spare machine per interruption, seconds"),
    ):
        p.add_argument(
            flag, type=non_negative, default=defaults[key], help=f"--project-ettr: {what} (default {defaults[key]:g})"
        )


def ettr_assumptions_defaults() -> dict[str, float]:
    from lab.evaluation.ettr_projection import Assumptions

    return {k: float(v) for k, v in asdict(Assumptions()).items()}


def non_negative(text: str) -> float:
    """A number >= 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def share(text: str) -> float:
    """A share between 0 and 1 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultline eval",
        description="Run the fault scenario suite against a real service and score its decisions.",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.list:
        for scenario in CATALOG.values():
            print(f"{scenario.name:<15} {scenario.family:<6} {scenario.description}")
        return 0
    previous = (
        signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        if sum(map(bool, (args.soak, args.campaign, args.corpus, args.project_ettr))) > 1:
            raise SetupError("--soak, --campaign, --corpus and --project-ettr are different runs: give one")
        if args.project_ettr:
            return _project_ettr(args)
        if args.hang_timeout is None:
            # The scenarios' and the soak's 30 s is shorter than a checkpoint's pause on purpose (their hang
            # scenarios are timed against it). The campaign's jobs run for hours through checkpoints (20-40 s) and
            # restarts: a real job registers a timeout above those, or every checkpoint is a hang incident.
            args.hang_timeout = CAMPAIGN_HANG_TIMEOUT_S if args.campaign else 30
        if args.corpus:
            return _corpus(args)
        return _soak(args) if args.soak else _campaign(args) if args.campaign else _run(args)
    except SetupError as exc:
        say(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _selection(args: argparse.Namespace) -> list[str]:
    has_torch = importlib.util.find_spec("torch") is not None
    names, problems = parse_selection(args.scenarios, torch=not args.no_torch)
    if not has_torch and not args.no_torch:
        torch_named = [n for n in names if CATALOG[n].family == TORCH]
        if args.scenarios and torch_named:
            problems.append(f"{', '.join(torch_named)} need PyTorch, which is not installed (pip install torch)")
        elif torch_named:
            say("PyTorch is not installed: the real torchrun scenarios are skipped (pip install torch to run them)")
        names = [n for n in names if CATALOG[n].family != TORCH]
    world = args.nodes * args.gpus_per_node
    if world % (args.tp * args.pp):
        problems.append(
            f"--tp {args.tp} x --pp {args.pp} must divide the simulated world size "
            f"({args.nodes} nodes x {args.gpus_per_node} GPUs = {world})"
        )
    if args.hang_timeout < 5:
        problems.append("--hang-timeout must be at least 5 s (the API's minimum)")
    if importlib.util.find_spec("psutil") is None:
        problems.append("faultline eval needs psutil to check that nothing is left running: pip install psutil")
    if not names and not problems:
        problems.append("no scenario to run")
    if problems:
        raise SetupError("; ".join(problems))
    return names


def _run(args: argparse.Namespace) -> int:
    from lab.evaluation.api import Api
    from lab.evaluation.runner import EvalConfig, Evaluation

    scenarios = _selection(args)
    data_dir: Path = args.data_dir.resolve()
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    config = EvalConfig(
        scenarios=scenarios,
        seeds=list(range(args.seed, args.seed + args.repeat)),
        data_dir=data_dir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tp=args.tp,
        pp=args.pp,
        parallel=args.parallel,
        fault_after=args.fault_after,
        hang_timeout_s=args.hang_timeout,
        healthy_s=args.healthy_duration,
        keep=args.keep,
    )
    say(f"{len(scenarios) * args.repeat} runs: {', '.join(scenarios)} x {args.repeat} seed(s); data in {data_dir}")
    started, wall = time.monotonic(), datetime.now().astimezone()
    harness = Harness(data_dir, args.port)
    job_ids: list[str] = []
    leftovers: list[str] = []
    try:
        harness.start()
        api = Api(harness.url, harness.tokens["operator"])
        evaluation = Evaluation(
            config,
            api=api,
            url=harness.url,
            agent_token=harness.tokens["agent"],
            env=harness.services.env,
            say=say,
            cancel=threading.Event(),
            health=harness.problem,
        )
        job_ids = evaluation.job_ids
        try:
            results = evaluation.run_all()
        finally:
            api.close()
    finally:
        harness.stop()
        leftovers = kill_leftovers(job_ids, harness.tokens.get("agent"))
    left = [p for r in results for p in r.leftovers] + leftovers
    clean = Target(
        "no leftover processes",
        FAIL if left else PASS,
        f"{len(left)} killed: {', '.join(left)}" if left else "every process stopped cleanly",
    )
    scores = [r.score for r in results]
    summary = summarize(scores, extra=[clean])
    per_scenario = spread.by_scenario(scores)
    print(format_table(scores))
    if any(row.runs > 1 for row in per_scenario):
        print("\nper scenario over its seeds (time to the first decision):")
        print(spread.format_spread(per_scenario))
    judged = [j for r in results for j in calibration.judge(GroundTruth.from_json(r.ground_truth), r.incidents)]
    bins = calibration.reliability(judged)
    # The policy the eval's worker ran with: the defaults, or the FAULTLINE_POLICY_* variables it inherited.
    settings = Settings(database_url="postgresql://unused", redis_url="redis://unused")
    levels = calibration.thresholds(
        judged,
        {"diagnose": settings.policy_diagnose_min_confidence, "evict": settings.policy_evict_min_confidence},
    )
    if bins:
        print("\ncalibration: each detector's confidence against how often it named a faulty machine (or, job-level,")
        print("a run with a fault):")
        print(calibration.format_report(bins, levels))
    print()
    print(format_summary(summary), flush=True)
    run_json = [r.to_json() for r in results]
    together = concurrent_faults(run_json)
    if config.parallel > 1:
        print(
            f"faults in two jobs at once: {len(together)} of {sum(1 for s in scores if s.faults)} fault runs had "
            "their fault while another job's was undecided",
            flush=True,
        )
    out = args.json or data_dir / "eval.json"
    report = {
        "started_at": wall.isoformat(),
        "duration_s": round(time.monotonic() - started, 1),
        "config": {**asdict(config), "data_dir": str(data_dir)},
        "api": harness.url,
        "runs": run_json,
        "concurrent_faults": together,
        "summary": summary.to_json(),
        "per_scenario": [row.to_json() for row in per_scenario],
        "calibration": {
            "bins": [b.to_json() for b in bins],
            "thresholds": [dict(zip(("policy", "confidence", "findings", "right"), t, strict=True)) for t in levels],
        },
        "leftover_processes": left,
        "service_error": evaluation.broken,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    say(f"results in {out}; service logs in {data_dir / 'logs'}")
    if evaluation.broken:
        say(f"error: {evaluation.broken}")
        return 2
    return 0 if summary.passed else 1


@contextlib.contextmanager
def _accelerated_services(data_dir: Path) -> Iterator[None]:
    """The database an accelerated-time run (soak, campaign) writes to: FAULTLINE_DATABASE_URL's, else embedded
    servers in `data_dir`; migrated; stopped after."""
    from service.embedded import free_port
    from service.stack import Services

    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    services = Services(logs=data_dir / "logs", say=say)
    database_url = os.environ.get("FAULTLINE_DATABASE_URL")
    try:
        if database_url:
            say("using the database of FAULTLINE_DATABASE_URL")
            services.use(
                database_url=database_url,
                redis_url=os.environ.get("FAULTLINE_REDIS_URL", "redis://unused"),
                port=0,
                embedded=False,
            )
        else:
            services.start_embedded(data_dir, port=free_port())
        services.migrate()
        yield
    finally:
        services.stop()


def _soak(args: argparse.Namespace) -> int:
    from lab.evaluation import report_files, soak, soak_config, soak_report
    from service.config import get_settings

    try:
        duration = soak_config.parse_duration(args.soak)
        jobs = soak_config.parse_jobs(args.soak_jobs)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    if duration > soak_config.MAX_SIMULATED_S:
        raise SetupError(
            f"--soak is at most {soak_config.MAX_SIMULATED_S / 86400:g} days (the service keeps 30 days of data)"
        )
    data_dir: Path = args.data_dir.resolve()
    with _accelerated_services(data_dir):
        config = soak_config.SoakConfig(
            duration_s=duration, seed=args.seed, jobs=tuple(jobs), hang_timeout_s=args.hang_timeout
        )
        report = soak.run_soak(config, get_settings(), say=say, processes=args.soak_processes)
    print(soak_report.format_report(report), flush=True)
    out = args.json or data_dir / "soak.json"
    report_files.write_report(report, out)
    say(f"results in {out}")
    return 0 if report_files.passed(report) else 1


def _project_ettr(args: argparse.Namespace) -> int:
    """A saved campaign's measured times priced at Llama 3's rate, with the assumptions given."""
    from lab.evaluation.ettr_projection import Assumptions, format_projection, project_report

    try:
        report = json.loads(args.project_ettr.read_text())
    except (OSError, ValueError) as exc:
        raise SetupError(f"{args.project_ettr}: {exc}") from None
    if not isinstance(report, dict) or "faults" not in report:
        raise SetupError(f"{args.project_ettr}: not a campaign's JSON (no faults)")
    assumptions = Assumptions(
        restart_s=args.restart_s,
        checkpoint_interval_s=args.checkpoint_interval_s,
        checkpoint_save_s=args.checkpoint_save_s,
        spare_wait_s=args.spare_wait_s,
    )
    try:
        projection = project_report(report, assumptions)
    except (TypeError, KeyError) as exc:
        raise SetupError(f"{args.project_ettr}: not a campaign's JSON ({exc})") from None
    if projection is None:
        raise SetupError(f"{args.project_ettr}: the campaign has no fault to measure times from")
    print(format_projection(projection), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(projection, indent=2) + "\n")
        say(f"projection in {args.json}")
    return 0


def _corpus(args: argparse.Namespace) -> int:
    from lab.evaluation import corpus

    try:
        paths = corpus.corpus_paths(args.corpus)
    except FileNotFoundError as exc:
        raise SetupError(str(exc)) from None
    if not paths:
        raise SetupError(f"{args.corpus}: no log files (*.txt, *.log)")
    data_dir: Path = args.data_dir.resolve()
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    parallel = args.parallel if args.parallel > 1 else CORPUS_PARALLEL
    say(f"{len(paths)} logs from {args.corpus}, {parallel} at a time; data in {data_dir}")
    started = time.monotonic()
    harness = Harness(data_dir, args.port)
    try:
        harness.start()
        run = corpus.CorpusRun(
            harness.url,
            token=harness.tokens["operator"],
            agent_token=harness.tokens["agent"],
            tag=f"corpus{datetime.now():%H%M%S}",
            parallel=parallel,
            say=say,
        )
        results = run.run(paths)
        problem = harness.problem()
    finally:
        harness.stop()
    summary = corpus.summarize(results)
    print(corpus.format_report(results, summary), flush=True)
    out = args.json or data_dir / "corpus.json"
    report = {**summary, "corpus": str(args.corpus), "wall_s": round(time.monotonic() - started, 1)}
    report["logs"] = [r.to_json() for r in results]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    say(f"results in {out} ({report['wall_s']:.0f} s)")
    if problem:
        say(f"error: {problem}")
        return 2
    return 0


def _campaign(args: argparse.Namespace) -> int:
    from lab.evaluation import campaign, campaign_report, report_files, soak_config
    from service.config import get_settings

    try:
        jobs = soak_config.parse_jobs(args.campaign_jobs)
        duration = soak_config.parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        raise SetupError(str(exc).replace("soak", "campaign")) from None
    if duration is None:
        duration = campaign.default_duration(args.faults, len(jobs))
    if duration > soak_config.MAX_SIMULATED_S:
        raise SetupError(
            f"--duration is at most {soak_config.MAX_SIMULATED_S / 86400:g} days (the service keeps 30 days)"
        )
    data_dir: Path = args.data_dir.resolve()
    if args.chaos:
        return _chaos_campaign(args, jobs, duration, data_dir)
    with _accelerated_services(data_dir):
        config = soak_config.SoakConfig(
            duration_s=duration, seed=args.seed, jobs=tuple(jobs), hang_timeout_s=args.hang_timeout
        )
        report = campaign.run_campaign(
            config,
            get_settings(),
            faults=args.faults,
            say=say,
            processes=args.soak_processes,
            service_checks=not args.campaign_placeholder_checks,
            shared_rate=args.shared_rate,
        )
    print(campaign_report.format_report(report), flush=True)
    out = args.json or data_dir / "campaign.json"
    report_files.write_report(report, out)
    say(f"results in {out}")
    return 0 if report_files.passed(report) else 1


def _chaos_campaign(args: argparse.Namespace, jobs: list[Any], duration: float, data_dir: Path) -> int:
    """The campaign against the service's own processes, killed at random moments (lab/evaluation/campaign_chaos.py)."""
    from lab.evaluation import campaign_chaos, campaign_report, report_files, soak_config
    from service.config import get_settings
    from service.embedded import free_port

    if os.environ.get("FAULTLINE_DATABASE_URL"):
        raise SetupError(
            "--chaos kills and restarts its own embedded PostgreSQL and Redis: unset FAULTLINE_DATABASE_URL"
        )
    try:
        calm = campaign_chaos.load_calm(args.calm)
    except (OSError, ValueError) as exc:
        raise SetupError(f"--calm: {exc}") from None
    config = soak_config.SoakConfig(
        duration_s=duration, seed=args.seed, jobs=tuple(jobs), hang_timeout_s=args.hang_timeout
    )
    report = campaign_chaos.run_chaos_campaign(
        config,
        get_settings,
        faults=args.faults,
        data_dir=data_dir,
        port=args.port or free_port(),
        blows=args.chaos_blows or max(4, args.faults // 4),
        say=say,
        service_checks=not args.campaign_placeholder_checks,
    )
    print(campaign_report.format_report(report), flush=True)
    print("", flush=True)
    print(campaign_chaos.format_chaos(report, calm), flush=True)
    out = args.json or data_dir / "campaign-chaos.json"
    report_files.write_report(report, out)
    say(f"results in {out}")
    c = report["chaos"]
    return 0 if c["batches_lost"] == 0 and not c["duplicate_decisions"] and not c["passes"]["lost"] else 1


class Harness:
    """The service one eval runs against: databases, migrations, tokens, API, worker and beat."""

    def __init__(self, data_dir: Path, port: int) -> None:
        from service.stack import Services

        self.data_dir, self.port = data_dir, port
        self.services = Services(logs=data_dir / "logs", say=say)
        self.url = ""
        self.tokens: dict[str, str] = {}
        self._token_ids: list[int] = []

    def start(self) -> None:
        """Embedded servers unless FAULTLINE_DATABASE_URL is set; raises SetupError with the reason."""
        import psycopg
        from pydantic import ValidationError
        from sqlalchemy.exc import SQLAlchemyError

        from service.embedded import free_port, port_is_free

        port = self.port or free_port()
        if not port_is_free(port):
            raise SetupError(f"port {port} is already in use; choose another with --port")
        try:
            database_url = os.environ.get("FAULTLINE_DATABASE_URL")
            if database_url:
                redis_url = os.environ.get("FAULTLINE_REDIS_URL")
                if not redis_url:
                    raise SetupError(
                        "FAULTLINE_DATABASE_URL is set but FAULTLINE_REDIS_URL is not: set both or neither"
                    )
                say("using the servers of FAULTLINE_DATABASE_URL and FAULTLINE_REDIS_URL")
                self.services.use(database_url=database_url, redis_url=redis_url, port=port, embedded=False)
            else:
                self.services.start_embedded(self.data_dir, port=port)
            self.services.migrate()
            self._create_tokens()
            # Every scenario and every corpus log adds its own nodes to one service, and the machines it takes
            # out stay out: within a run they would soon pass the fleet breaker's share and be held for a person.
            # The eval scores each fault alone; the breaker's own tests are in tests/service/breaker.
            self.services.env.setdefault("FAULTLINE_BREAKER_ENABLED", "false")
            say(f"starting the API on port {port}, a worker and beat (logs in {self.services.logs})")
            self.url = self.services.start_processes(port)
        except ValidationError as exc:
            messages = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise SetupError(f"configuration error: {messages}") from None
        except (RuntimeError, OSError, SQLAlchemyError, psycopg.Error) as exc:
            raise SetupError(f"could not start the services: {exc}") from None
        except SystemExit as exc:  # embedded mode without its packages
            raise SetupError(str(exc.code)) from None
        say(f"API ready at {self.url}")

    def _create_tokens(self) -> None:
        from service.db import session_scope
        from service.tokens import service as tokens

        with session_scope() as session:
            operator = tokens.create(session, scope="operator", name="faultline-eval")
            agent = tokens.create(session, scope="agent", name="faultline-eval")
            self._token_ids = [operator.record.id, agent.record.id]
            self.tokens = {"operator": operator.token, "agent": agent.token}

    def problem(self) -> str | None:
        """Why the service cannot decide anything (one of its processes exited), or None."""
        exited = self.services.exited()
        if exited is None:
            return None
        name, code = exited
        return f"the {name} process exited with code {code}; see {self.services.logs / (name + '.log')}"

    def stop(self) -> None:
        """Revoke the eval's tokens (they end with it), then stop the processes and the embedded servers."""
        if self._token_ids:
            from service.db import session_scope
            from service.tokens import service as tokens

            with contextlib.suppress(Exception), session_scope() as session:
                for token_id in self._token_ids:
                    tokens.revoke(session, token_id=token_id)
        say("stopping the services ...")
        self.services.stop()


def kill_leftovers(job_ids: list[str], agent_token: str | None) -> list[str]:
    """Processes of this eval still alive: its children, and anything carrying one of its job ids or its
    agent token (ranks re-parented when their launcher died). Killed by pid; returned as "pid name"."""
    import psutil

    me = psutil.Process()
    found: dict[int, Any] = {}
    with contextlib.suppress(psutil.Error):
        found.update({p.pid: p for p in me.children(recursive=True)})
    jobs = set(job_ids)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            if env.get("FAULTLINE_JOB_ID") in jobs or (agent_token and env.get("FAULTLINE_AGENT_TOKEN") == agent_token):
                found[proc.pid] = proc
    found.pop(me.pid, None)
    left = []
    for proc in found.values():
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            left.append(f"{proc.pid} {proc.name()}")
            proc.kill()
    if left:
        say(f"killed {len(left)} leftover processes: {', '.join(left)}")
    return left
