"""`faultline eval --soak DURATION`: several healthy jobs with real-life noise, over simulated hours, in
accelerated time; every finding, incident and decision they draw is reported.

What runs for real: the simulator's cluster model with its realism on (checkpoints, evaluations, restarts from a
checkpoint, loader stalls, warmup and loss spikes, per-node speed, thermal drift over the day, a late node,
agent restarts, clock skew), the agent's own parsers and node collectors (lab/evaluation/soak_agent.py), the
service's ingest into PostgreSQL, its diagnosis passes every `diagnosis_interval_s` of simulated time (on beat's
marks) and the fast pass on critical events, incidents, silences and the decision policy. What is simulated: the
clock (the data carries simulated times and each pass runs with now = simulated time, which is how an hour takes
minutes), the HTTP hop, Celery's scheduling, and the agent processes. Stack-dump requests are counted, not
answered (no process to dump): a healthy job should not draw any.

The simulated day ends shortly before the wall clock's now, so every time stored is a plausible past one. What a
soak runs is read by lab/evaluation/soak_config.py; its targets and its table are lab/evaluation/soak_report.py's.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lab.evaluation.report_files import hms
from lab.evaluation.soak_agent import VirtualAgent
from lab.evaluation.soak_config import SoakConfig, SoakJob
from lab.evaluation.soak_report import targets
from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from lab.sim.realism import START
from service.config import Settings
from service.db import session_scope
from service.decisions.lifecycle import expire_overdue
from service.diagnosis.service import diagnose_events, diagnose_job
from service.incidents.service import resolve_quiet, resolve_recovered
from service.ingest.handoff import jobs_with_critical_events, jobs_with_stack_answers
from service.ingest.schemas import IngestBatch
from service.ingest.service import UpsertCache, store_batches
from service.jobs.schemas import JobIn, Parallelism
from service.jobs.service import register
from service.models import Decision, Directive, Finding, Incident, Job, Node
from service.schedules import diagnosis_passes

SHIP_S = 5.0  # the agent's default ship interval
SAMPLE_S = 1.0  # and its sample interval
MAINTENANCE_S = 60.0  # incidents quiet this long resolve; pending decisions expire (the beat's minute tasks)
PROGRESS_EVERY_S = 30.0  # wall seconds between progress lines


@dataclass
class JobRun:
    spec: SoakJob
    job_id: str
    cluster: Cluster
    agents: list[VirtualAgent]
    generation: int = -1
    passes: int = 0
    beat_passes: int = 0  # of `passes`, those on beat's marks; the rest followed stack answers or critical events
    fast_passes: int = 0
    pass_s: float = 0.0
    decision_times: dict[int, float] = field(default_factory=dict)  # decision id -> simulated second made
    stage_s: Counter[str] = field(default_factory=Counter)  # seconds per pass stage, over every pass


class Soak:
    """The soak of some of the config's jobs (`indices`, default all) in this process."""

    def __init__(
        self, config: SoakConfig, settings: Settings, *, say: Callable[[str], None], indices: list[int] | None = None
    ) -> None:
        self.config, self.settings, self.say = config, settings, say
        self.indices = indices if indices is not None else list(range(len(config.jobs)))
        self.start = config.start - timedelta(seconds=config.duration_s)
        self.run_id = config.run_id
        self.tree_dir = Path(tempfile.mkdtemp(prefix="faultline-soak-", dir=_tree_parent()))
        self.cache = UpsertCache()
        self.answered: set[uuid.UUID] = set()  # stack requests the agents answered
        self.jobs: list[JobRun] = []
        self.wall_s = 0.0
        self.covered_s = 0.0  # simulated seconds run so far

    # -- set-up --

    def _make_jobs(self, session: Session) -> None:
        for i in self.indices:
            spec = self.config.jobs[i]
            job_id = f"soak-{self.run_id}-{spec.name}"
            sim = SimConfig(
                nodes=spec.nodes,
                gpus_per_node=spec.gpus_per_node,
                scenario=spec.scenario,
                fault_after=spec.fault_after,
                fault_node=spec.fault_node,
                seed=self.config.seed * 1000 + i,
                job_id=job_id,
                node_prefix=f"soak{self.run_id}{spec.name}-",
                start=self.start,
                realism=True,
                realism_params=self.config.realism,
                agents=False,
            )
            cluster = Cluster(sim)
            dp = spec.nodes * spec.gpus_per_node // (spec.tp * spec.pp)
            register(
                session,
                job_in=JobIn(
                    job_id=job_id,
                    world_size=cluster.world,
                    parallelism=Parallelism(tp=spec.tp, pp=spec.pp, dp=dp),
                    hang_timeout_s=self.config.hang_timeout_s,
                ),
            )
            agents = [
                VirtualAgent(cluster, n, job_id=job_id, tree_dir=self.tree_dir, pid_base=100_000 * (i + 1))
                for n in range(spec.nodes)
            ]
            run = JobRun(spec, job_id, cluster, agents)
            for n, agent in enumerate(agents):
                if cluster.agent_delay(n) <= 0:
                    agent.start(self.start)
            self._sync_pids(run)
            self.jobs.append(run)

    @staticmethod
    def _sync_pids(run: JobRun) -> None:
        """The model prints the ranks' pids (torchrun's lines); a restart starts new ones."""
        c = run.cluster
        if c.generation == run.generation:
            return
        run.generation = c.generation
        for n, agent in enumerate(run.agents):  # one agent per machine; spares run no ranks
            c.set_pids(n, {lr: agent.pid(rank) for lr, rank in enumerate(c.ranks_on(n))})
            c.launcher_pids[n] = 90_000 + n

    # -- the loop --

    def run(self) -> dict[str, Any]:
        cfg, started = self.config, time.monotonic()
        with session_scope() as session:
            self._make_jobs(session)
        self.say(self._banner())
        steps = round(cfg.duration_s / SAMPLE_S)
        ship_every, maint_every = (max(1, round(s / SAMPLE_S)) for s in (SHIP_S, MAINTENANCE_S))
        passes = diagnosis_passes(self.settings)
        last_progress = time.monotonic()
        try:
            with _stop_requests() as stop:
                for k in range(1, steps + 1):
                    if stop.is_set():
                        raise KeyboardInterrupt
                    t = k * SAMPLE_S
                    now = self.start + timedelta(seconds=t)
                    for run in self.jobs:
                        self._advance(run, t, now)
                    self._tick(t, now)
                    if k % ship_every == 0:
                        self._ship(now)
                    else:
                        self._ship(now, critical_only=True)
                    if passes.crossed(now - timedelta(seconds=SAMPLE_S), now):  # beat's marks (service/schedules)
                        for run in self.jobs:
                            self._pass(run, now, fast=False)
                            run.beat_passes += 1
                    if k % maint_every == 0:
                        self._maintenance(now)
                    self.covered_s = t
                    if self._finished():
                        break
                    if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                        last_progress = time.monotonic()
                        self._progress(t, started)
        except KeyboardInterrupt:
            # Ctrl-C: the time covered so far is reported like a shorter soak.
            self.say(f"interrupted after {hms(self.covered_s)} of simulated time; reporting that")
        finally:
            shutil.rmtree(self.tree_dir, ignore_errors=True)
        self.wall_s = time.monotonic() - started
        return self.report()

    def _banner(self) -> str:
        shape = ", ".join(
            f"{j.job_id} ({j.spec.nodes}x{j.spec.gpus_per_node}, tp {j.spec.tp} pp {j.spec.pp})" for j in self.jobs
        )
        return f"soak: {hms(self.config.duration_s)} of simulated time from {self.start.isoformat()}: {shape}"

    def _tick(self, t: float, now: datetime) -> None:
        """Each simulated second, after the jobs moved: what a harness built on this one adds (the campaign)."""

    def _finished(self) -> bool:
        """A harness built on this one may end before the duration (the campaign, once its faults are done)."""
        return False

    def _advance(self, run: JobRun, t: float, now: datetime) -> None:
        c = run.cluster
        lines = c.advance(t)
        self._sync_pids(run)
        for action in c.take_agent_actions():
            agent = run.agents[action.node]
            if action.action == START:
                agent.start(now)
            else:
                agent.stop(action.signal)
        by_node: dict[str, list[Any]] = {}
        for line in lines:
            by_node.setdefault(line.node, []).append(line)
        snapshot = c.snapshot()
        for agent in run.agents:
            agent.read_lines(by_node.get(agent.name, []), now)
            agent.sample(now, snapshot[agent.name])

    def _stack_requests(self) -> dict[str, list[str]]:
        """Job id -> the stack requests (dump_stacks directives) the service made since the last ship: the agents
        answer them in this batch, as agents do the directives an ingest answer carries."""
        with session_scope() as session:
            rows = session.execute(
                select(Directive.id, Job.external_id)
                .join(Job, Job.id == Directive.job_id)
                .where(
                    Directive.kind == "dump_stacks",
                    Job.external_id.in_([run.job_id for run in self.jobs]),
                    Directive.id.not_in(self.answered or {uuid.UUID(int=0)}),
                )
                .order_by(Directive.created_at)
            ).all()
        out: dict[str, list[str]] = {}
        for directive_id, job_id in rows:
            self.answered.add(directive_id)
            out.setdefault(job_id, []).append(str(directive_id))
        return out

    def _ship(self, now: datetime, *, critical_only: bool = False) -> None:
        """The agents' ship tick; `critical_only`: between ticks, only the agents holding a critical event, which
        the agent ships at once (agents/agent.py), with the samples gathered so far."""
        if critical_only:
            raw = [
                b
                for run in self.jobs
                for a in run.agents
                if a.has_critical() and (b := a.batch(now, urgent=True)) is not None
            ]
        else:
            asked = self._stack_requests()
            raw = [
                b for run in self.jobs for a in run.agents if (b := a.batch(now, asked.get(run.job_id, ()))) is not None
            ]
        if not raw:
            return
        context = self.settings.time_context
        batches = [IngestBatch.model_validate(b, context=context) for b in raw]
        self._store(raw, batches)
        urgent = set().union(*(jobs_with_critical_events(b) for b in batches))
        full = set().union(
            *(jobs_with_stack_answers(b) | jobs_with_critical_events(b, needing_steps=True) for b in batches)
        )
        for run in self.jobs:
            if run.job_id in urgent:
                self._pass(run, now, fast=True)
            if run.job_id in full:
                self._pass(run, now, fast=False)

    def _store(self, raw: list[dict[str, Any]], batches: list[IngestBatch]) -> None:
        """Ingest's write, in-process (the HTTP hop simulated); the chaos campaign ships `raw` over HTTP instead."""
        with session_scope() as session:
            store_batches(session, batches=batches, cache=self.cache)

    def _pass(self, run: JobRun, now: datetime, *, fast: bool) -> None:
        began = time.perf_counter()
        with session_scope() as session:
            fn = diagnose_events if fast else diagnose_job
            result = fn(session, job_id=run.job_id, settings=self.settings, now=now)
        run.pass_s += time.perf_counter() - began
        run.stage_s.update(result.timings)
        if fast:
            run.fast_passes += 1
        else:
            run.passes += 1
        t = (now - self.start).total_seconds()
        for decision_id in result.decisions:
            run.decision_times.setdefault(decision_id, t)
        if result.decisions:
            self.say(f"soak: t={hms(t)} {run.job_id}: {len(result.decisions)} decision(s) {result.decisions}")

    def _maintenance(self, now: datetime) -> None:
        # This process's jobs only: the others' processes keep their own simulated clocks.
        with session_scope() as session:
            mine = session.scalars(select(Job.id).where(Job.external_id.in_([r.job_id for r in self.jobs]))).all()
            resolve_recovered(session, now=now, after_s=self.settings.incident_recovered_after_s, job_ids=mine)
            resolve_quiet(session, now=now, quiet_s=self.settings.incident_quiet_resolve_s, job_ids=mine)
            expire_overdue(session, now=now, job_ids=mine)

    def _progress(self, t: float, started: float) -> None:
        wall = time.monotonic() - started
        rate = t / wall if wall else 0.0
        left = (self.config.duration_s - t) / rate if rate else math.inf
        passes = sum(r.passes for r in self.jobs)
        self.say(
            f"soak: {hms(t)} of {hms(self.config.duration_s)} simulated ({rate:.0f}x real time, ~{left / 60:.0f} min "
            f"left), {passes} passes"
        )

    # -- the report --

    def report(self) -> dict[str, Any]:
        job_ids = [r.job_id for r in self.jobs]
        with session_scope() as session:
            ids: dict[str, int] = {
                name: pk
                for name, pk in session.execute(select(Job.external_id, Job.id).where(Job.external_id.in_(job_ids)))
            }
            prefix = f"soak{self.run_id}"
            names = {
                pk: name for pk, name in session.execute(select(Node.id, Node.name).where(Node.name.startswith(prefix)))
            }
            by_id = {ids[r.job_id]: r for r in self.jobs}
            findings = session.scalars(
                select(Finding).where(Finding.job_id.in_(ids.values())).order_by(Finding.id)
            ).all()
            incidents = session.scalars(
                select(Incident).where(Incident.job_id.in_(ids.values())).order_by(Incident.id)
            ).all()
            decisions = session.scalars(
                select(Decision).where(Decision.job_id.in_(ids.values())).order_by(Decision.id)
            ).all()
            directives = session.scalars(select(Directive).where(Directive.job_id.in_(ids.values()))).all()
            job_rows = []
            for run in self.jobs:
                jid = ids[run.job_id]
                mine = [d for d in decisions if d.job_id == jid]
                kinds = Counter(d.kind for d in mine)
                real = run.cluster.real
                noise = Counter(e["kind"] for e in (real.events if real else []))
                job_rows.append(
                    {
                        "job_id": run.job_id,
                        "nodes": run.spec.nodes,
                        "gpus": run.cluster.world,
                        "tp": run.spec.tp,
                        "pp": run.spec.pp,
                        "steps_trained": run.cluster.job.step,
                        "noise": dict(sorted(noise.items())),
                        "faults": [f.to_json() for f in run.cluster.faults],  # none in a healthy soak
                        "findings": sum(1 for f in findings if f.job_id == jid),
                        "incidents": sum(1 for i in incidents if i.job_id == jid),
                        "decisions": dict(sorted(kinds.items())),
                        "evictions": kinds.get("evict", 0),
                        "diagnoses": kinds.get("diagnose", 0),
                        "stack_requests": sum(1 for d in directives if d.job_id == jid),
                        "passes": run.passes,
                        "beat_passes": run.beat_passes,
                        "fast_passes": run.fast_passes,
                        "mean_pass_ms": round(1000 * run.pass_s / max(1, run.passes + run.fast_passes), 1),
                        "pass_stage_ms": {
                            k: round(1000 * v / max(1, run.passes), 2) for k, v in run.stage_s.most_common()
                        },
                        "batches": sum(a.batches for a in run.agents),
                    }
                )

            def t_of(at: datetime) -> float:
                return round((at - self.start).total_seconds(), 1)

            report = {
                "simulated_s": self.covered_s,
                "interrupted": self.covered_s < self.config.duration_s,
                "started_at": self.start.isoformat(),
                "wall_s": round(self.wall_s, 1),
                "seed": self.config.seed,
                "realism": asdict(self.config.realism),
                "jobs": job_rows,
                "findings": [
                    {
                        "job_id": by_id[f.job_id].job_id if f.job_id in by_id else None,
                        "t_s": t_of(f.observed_at),
                        "detector": f.detector,
                        "node": names.get(f.node_id) if f.node_id else None,
                        "subject": f.subject,
                        "confidence": round(f.confidence, 3),
                        "summary": f.summary,
                    }
                    for f in findings
                ],
                "incidents": [
                    {
                        "id": i.id,
                        "job_id": by_id[i.job_id].job_id,
                        "state": i.state,
                        "root_cause": i.root_cause,
                        "confidence": round(i.confidence, 3),
                        "suspects": i.suspects,
                        "summary": i.summary,
                    }
                    for i in incidents
                ],
                "decisions": [
                    {
                        "id": d.id,
                        "job_id": by_id[d.job_id].job_id if d.job_id in by_id else None,
                        "t_s": by_id[d.job_id].decision_times.get(d.id) if d.job_id in by_id else None,
                        "kind": d.kind,
                        "node": names.get(d.node_id) if d.node_id else None,
                        "gpu": d.gpu,
                        "confidence": round(d.confidence, 3),
                        "reason": d.reason,
                    }
                    for d in decisions
                ],
            }
        report["targets"] = targets(report)
        return report


def run_soak(config: SoakConfig, settings: Settings, *, say: Callable[[str], None], processes: int) -> dict[str, Any]:
    """Every job of the config, spread over `processes` worker processes (one job each at most); one report."""
    groups = [list(range(len(config.jobs)))[k::processes] for k in range(min(processes, len(config.jobs)))]
    if len(groups) == 1:
        return Soak(config, settings, say=say).run()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no engine or pool inherited
    with ProcessPoolExecutor(max_workers=len(groups), mp_context=context) as pool:
        futures = [pool.submit(_run_group, (config, settings, say, g)) for g in groups]
        workers = list(getattr(pool, "_processes", {}).values())

        def forward(signum: int, frame: object) -> None:
            for worker in workers:
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, signal.SIGTERM)

        # Ctrl-C reaches the workers too (one process group) and SIGTERM is passed on to them: each stops and
        # reports what it covered, which this process waits for instead of dying first.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, forward)
        try:
            parts = [f.result() for f in futures]
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
    merged = {
        **parts[0],
        "wall_s": max(p["wall_s"] for p in parts),
        "simulated_s": min(p["simulated_s"] for p in parts),
        "interrupted": any(p["interrupted"] for p in parts),
    }
    for key in ("jobs", "findings", "incidents", "decisions"):
        merged[key] = [item for p in parts for item in p[key]]
    merged["jobs"].sort(key=lambda j: j["job_id"])
    merged["targets"] = targets(merged)
    return merged


def _run_group(args: tuple[SoakConfig, Settings, Callable[[str], None], list[int]]) -> dict[str, Any]:
    config, settings, say, indices = args
    # Whatever this worker inherited (a background shell ignores SIGINT), Ctrl-C and SIGTERM end its soak early.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)
    return Soak(config, settings, say=say, indices=indices).run()


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stop_requests() -> Iterator[threading.Event]:
    """While the loop runs, Ctrl-C and SIGTERM end it at the next simulated second, never inside a database write:
    an interrupt in the middle of a COPY left its connection unusable, and the failed rollback hid the interrupt
    (a campaign worker died without its report). A Ctrl-C reaches a campaign's workers twice (the terminal's and
    the one their parent passes on): both only ask."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, lambda signum, frame: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _tree_parent() -> str | None:
    """Shared memory where there is some: the node trees' small files change every ship tick."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 256 << 20 else None
