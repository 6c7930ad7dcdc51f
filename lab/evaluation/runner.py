"""The eval loop: for each scenario and seed, register the job, run it, watch the API for decisions, score."""

from __future__ import annotations

import secrets
import shutil
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from lab.evaluation.api import Api, ApiError, EndpointMissing
from lab.evaluation.records import ScenarioScore, parse_decisions
from lab.evaluation.runs import Cancelled, ScenarioRun, SimRun, TorchRun, wait_until
from lab.evaluation.scenarios import CATALOG, DOMAIN_FAULTS, MULTI_FAULT, SIM, wait_after_injection
from lab.evaluation.scoring import CONCLUSIVE_KINDS, answering_decisions, score_scenario
from lab.sim.nvl72 import COMPUTE_TRAYS, GPUS_PER_TRAY
from lab.sim.scenarios import SCENARIOS as SIM_SCENARIO_DEFS

# Up to the fault: the sim's --fault-after plus startup; a torchrun job imports torch in 8 processes first.
SIM_START_SLACK_S = 120.0
TORCH_INJECT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class EvalConfig:
    scenarios: list[str]
    seeds: list[int]
    data_dir: Path
    nodes: int = 4
    gpus_per_node: int = 4
    # The parallelism the simulated jobs are registered with (torchrun jobs stay plain data parallelism).
    tp: int = 1
    pp: int = 1
    parallel: int = 1
    fault_after: float = 30.0
    hang_timeout_s: int = 30
    healthy_s: float = 180.0
    keep: bool = False
    poll_s: float = 2.0
    # After the first conclusive decision, watch this much longer for more (e.g. a wrong second eviction).
    settle_s: float = 20.0


@dataclass
class RunResult:
    score: ScenarioScore
    ground_truth: dict[str, Any]
    decisions: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    workdir: str
    leftovers: list[str] = field(default_factory=list)
    started_at: str | None = None
    ended_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "score": self.score.to_json(),
            "ground_truth": self.ground_truth,
            "decisions": self.decisions,
            "incidents": self.incidents,
            "workdir": self.workdir,
            "leftover_processes": self.leftovers,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }


def _now() -> datetime:
    return datetime.now().astimezone()


class Evaluation:
    def __init__(
        self,
        config: EvalConfig,
        *,
        api: Api,
        url: str,
        agent_token: str,
        env: dict[str, str],
        say: Callable[[str], None],
        cancel: threading.Event,
        health: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.config, self.api, self.url, self.agent_token, self.env = config, api, url, agent_token, env
        self.say, self.cancel, self.health = say, cancel, health
        self.job_ids: list[str] = []
        # Set when a service process (API, worker, beat) died: the runs still to come are skipped.
        self.broken: str | None = None
        self.run_id = secrets.token_hex(2)

    def plan(self) -> list[tuple[str, int]]:
        return [(name, seed) for seed in self.config.seeds for name in self.config.scenarios]

    def run_all(self) -> list[RunResult]:
        """Every (scenario, seed), `parallel` at a time, in plan order; stops early when cancelled or broken."""
        plan = self.plan()
        results: dict[int, RunResult] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.config.parallel), thread_name_prefix="eval") as pool:
            futures: dict[Future[RunResult | None], int] = {
                pool.submit(self.run_one, n, s): i for i, (n, s) in enumerate(plan)
            }
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        error = future.exception()
                        if error is None:
                            if (result := future.result()) is not None:
                                results[futures[future]] = result
                        elif not isinstance(error, Cancelled):
                            raise error
            except BaseException:
                self.cancel.set()
                for future in pending:
                    future.cancel()
                raise
        return [results[i] for i in sorted(results)]

    def _new_run(self, name: str, seed: int, job_id: str, prefix: str, workdir: Path) -> ScenarioRun:
        c = self.config
        scenario = CATALOG[name]
        if scenario.family == SIM:
            watch = c.healthy_s if scenario.fault is None else wait_after_injection(scenario.fault, c.hang_timeout_s)
            nodes, gpus = c.nodes, c.gpus_per_node
            if SIM_SCENARIO_DEFS[name].nvl72:  # the trays of one NVL72 rack: at most 18, 4 GPUs each
                nodes, gpus = min(nodes, COMPUTE_TRAYS), GPUS_PER_TRAY
            return SimRun(
                scenario=name,
                seed=seed,
                job_id=job_id,
                node_prefix=prefix,
                workdir=workdir,
                url=self.url,
                agent_token=self.agent_token,
                env=self.env,
                nodes=nodes,
                gpus_per_node=gpus,
                fault_after=c.fault_after,
                # A backstop only: the eval stops the sim itself, but a sim must never run on forever.
                duration=c.fault_after + SIM_START_SLACK_S + watch + 60,
            )
        return TorchRun(
            scenario=name,
            seed=seed,
            job_id=job_id,
            node_prefix=prefix,
            workdir=workdir,
            url=self.url,
            agent_token=self.agent_token,
            env=self.env,
        )

    def _check_health(self) -> str | None:
        if self.broken is None and (problem := self.health()) is not None:
            self.broken = problem
            self.say(f"error: {problem}; the remaining scenarios are skipped")
        return self.broken

    def run_one(self, name: str, seed: int) -> RunResult | None:
        """Run one scenario with one seed, watch for decisions until its deadline, stop it, score it.

        None when skipped because the service is down."""
        if self._check_health() is not None:
            return None
        c = self.config
        scenario = CATALOG[name]
        tag = f"{name} seed {seed}"
        slug = name.replace("_", "")
        job_id = f"eval-{self.run_id}-{slug}-s{seed}"
        prefix = f"e{self.run_id}-{slug}-s{seed}"
        workdir = c.data_dir / "runs" / f"{self.run_id}-{name}-s{seed}"
        self.job_ids.append(job_id)
        run = self._new_run(name, seed, job_id, prefix, workdir)
        started = _now()
        decisions: list[dict[str, Any]] = []
        incidents: list[dict[str, Any]] = []
        errors: list[str] = []
        leftovers: list[str] = []
        try:
            tp, pp = (c.tp, c.pp) if scenario.family == SIM else (1, 1)
            self.api.register_job(
                job_id=job_id,
                world_size=run.world_size,
                hang_timeout_s=c.hang_timeout_s,
                tp=tp,
                pp=pp,
                ranks=_rank_map(prefix, c.nodes, c.gpus_per_node) if metrics_only(name) else None,
            )
        except ApiError as exc:
            errors.append(f"registering the job: {exc}")
        if not errors:
            self.say(f"{tag}: starting ({scenario.family}, job {job_id}, files in {workdir})")
            try:
                run.start()
                decisions, incidents = self._watch(run, tag, scenario.fault, errors)
            except Cancelled:
                self.say(f"{tag}: interrupted")
                raise
            except Exception as exc:  # a harness bug must not take the other scenarios down with it
                log = c.data_dir / "logs" / "eval-errors.log"
                with log.open("a") as f:
                    f.write(f"--- {tag} ({job_id})\n{traceback.format_exc()}\n")
                errors.append(f"eval error: {exc!r} (traceback in {log})")
            finally:
                leftovers = run.stop()
                if leftovers:
                    self.say(f"{tag}: had to kill {len(leftovers)} leftover processes: {', '.join(leftovers)}")
        truth = run.ground_truth()
        result = score_scenario(
            truth,
            decisions,
            incidents,
            seed=seed,
            hang_timeout_s=float(c.hang_timeout_s),
            error="; ".join(dict.fromkeys(errors)) or None,
        )
        result.node_prefix = prefix
        self._report(tag, result)
        if not c.keep and result.correct and result.error is None and not leftovers:
            shutil.rmtree(workdir, ignore_errors=True)
        return RunResult(
            score=result,
            ground_truth=truth.to_json(),
            decisions=decisions,
            incidents=incidents,
            workdir=str(workdir),
            leftovers=leftovers,
            started_at=started.isoformat(),
            ended_at=_now().isoformat(),
        )

    def _watch(
        self, run: ScenarioRun, tag: str, fault: str | None, errors: list[str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Wait for the fault, then poll the decisions until the deadline (or settled); the final lists."""
        c = self.config
        timeout = c.fault_after + SIM_START_SLACK_S if isinstance(run, SimRun) else TORCH_INJECT_TIMEOUT_S
        short = _shortener(run.node_prefix)
        if fault is None:
            if not wait_until(lambda: run.ready() or run.failure() is not None, timeout=timeout, cancel=self.cancel):
                errors.append(f"the cluster did not come up within {timeout:.0f} s")
                return [], []
            since, wait_s = _now(), c.healthy_s
            self.say(f"{tag}: up at {since:%H:%M:%S}, watching for {wait_s:.0f} s (nothing may be evicted)")
        else:
            wait_until(
                lambda: run.injected_at() is not None or run.failure() is not None, timeout=timeout, cancel=self.cancel
            )
            injected = run.injected_at()
            if injected is None:
                errors.append(run.failure() or f"the fault was not injected within {timeout:.0f} s")
                return [], []
            since, wait_s = injected, wait_after_injection(fault, c.hang_timeout_s)
            where = ", ".join(sorted(short(n) for n in run.ground_truth().faulty_nodes))
            self.say(
                f"{tag}: injected at {injected:%H:%M:%S}" + (f" on {where}" if where else "")
                + f", waiting for a decision (deadline {wait_s:.0f} s)"
            )  # fmt: skip
        deadline = since + timedelta(seconds=wait_s)
        self._poll(run, tag, since if fault else None, deadline, errors, settle=fault not in MULTI_FAULT, fault=fault)
        return self._collect(run, errors)

    def _poll(
        self,
        run: ScenarioRun,
        tag: str,
        injected: datetime | None,
        deadline: datetime,
        errors: list[str],
        *,
        settle: bool = True,
        fault: str | None = None,
    ) -> None:
        """Announce decisions as they come until the deadline; with `settle`, stop `settle_s` after the first
        conclusive one."""
        settle_at: datetime | None = None
        announced: set[int] = set()
        short = _shortener(run.node_prefix)
        warned = False
        while _now() < deadline and (settle_at is None or _now() < settle_at):
            if self.cancel.is_set():
                raise Cancelled
            try:
                parsed = parse_decisions(self._decisions(run, domain=fault in DOMAIN_FAULTS))
            except EndpointMissing as exc:
                errors.append(str(exc))
                self.say(f"{tag}: error: {exc}")
                return  # nothing to watch
            except ApiError as exc:
                self.say(f"{tag}: warning: {exc}")  # a slow or restarting API: try again
                parsed = []
            for d in parsed:
                if d.id in announced:
                    continue
                announced.add(d.id)
                after = ""
                if injected is not None and d.created_at is not None:
                    after = f" {(d.created_at - injected).total_seconds():.1f} s after the fault"
                node = short(d.node) if d.node else "the job"
                self.say(f"{tag}: decision{after}: {d.kind} {node} ({d.state}, confidence {d.confidence:.2f})")
            if (
                settle
                and settle_at is None
                and any(d.kind in CONCLUSIVE_KINDS or d.shared_cordon for d in answering_decisions(parsed, injected))
            ):
                settle_at = _now() + timedelta(seconds=self.config.settle_s)
            if not warned and (failure := run.failure()) is not None:
                warned = True
                self.say(f"{tag}: warning: {failure}")
            if (problem := self._check_health()) is not None:
                errors.append(problem)
                return
            self.cancel.wait(self.config.poll_s)

    def _decisions(self, run: ScenarioRun, *, domain: bool = True) -> list[dict[str, Any]]:
        """The job's decisions, with (`domain`) the shared incidents' cordons of its nodes (an NVLink domain drained
        whole: decided for the domain, they belong to no job)."""
        decisions = self.api.decisions(run.job_id)
        if domain:
            known = {d.get("id") for d in decisions}
            nodes = run.ground_truth().nodes
            decisions += [d for d in self.api.shared_cordons(nodes) if d.get("id") not in known]
        return decisions

    def _collect(self, run: ScenarioRun, errors: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The decisions and incidents of the job as they stand now (before the run is stopped)."""
        decisions: list[dict[str, Any]] = []
        incidents: list[dict[str, Any]] = []
        job_id = run.job_id
        try:
            decisions = self._decisions(run)
        except ApiError as exc:
            errors.append(str(exc))
        try:
            incidents = self.api.incidents(job_id)
        except ApiError as exc:
            errors.append(str(exc))
        return decisions, incidents

    def _report(self, tag: str, s: ScenarioScore) -> None:
        if s.error:
            self.say(f"{tag}: error: {s.error}")
        t = f", first decision after {s.time_to_decision_s:.1f} s" if s.time_to_decision_s is not None else ""
        verdict = "correct" if s.correct else "WRONG"
        evicted = ", ".join(_shortener(s.node_prefix)(n) for n in s.evicted) or "nothing"
        self.say(f"{tag}: {'detected' if s.detected else 'not detected'}, evicted {evicted} ({verdict}){t}")


def _shortener(prefix: str) -> Callable[[str], str]:
    """Node names as printed: without the run's prefix."""
    return lambda name: name.removeprefix(prefix + "-") if prefix else name


def metrics_only(name: str) -> bool:
    """A sim scenario whose agents read dcgm-exporter alone: its job is known by the rank map registered for it."""
    scenario = SIM_SCENARIO_DEFS.get(name)
    return scenario is not None and scenario.metrics_only


def _rank_map(prefix: str, nodes: int, gpus_per_node: int) -> list[dict[str, Any]]:
    """Where the sim runs each rank (node names as SimRun asks the sim for them: PREFIX-node-000, ...)."""
    return [
        {"rank": n * gpus_per_node + g, "node": f"{prefix}-node-{n:03d}", "local_rank": g, "gpu": g}
        for n in range(nodes)
        for g in range(gpus_per_node)
    ]
