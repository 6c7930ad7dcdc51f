"""`faultline eval --campaign`: one long-lived service, long-running jobs, faults back to back drawn from a
published fleet's mix (lab/sim/mix.py), and the closed loop acting on the service's decisions as a scheduler
would; reported by lab/evaluation/campaign_report.py, scored by lab/evaluation/campaign_scoring.py.

It runs on the soak's accelerated-time harness (lab/evaluation/soak.py: the simulator's cluster model with
its real-life noise, the agent's own parsers, real ingest into PostgreSQL, diagnosis passes with now = simulated
time, incident and decision maintenance). What the campaign adds, per job:

- A healthy stretch (the soak's noise only), then one fault from the mix on a node drawn uniformly, and so on.
- Each pending decision is done to the cluster by the closed loop's core (lab/sim/actions.py `act`: evict ->
  a spare swapped in and the job restarted from its checkpoint; reset_gpu; diagnose -> out for a check; repaired
  machines back to the pool), then acknowledged through the service's own function, as a scheduler acks over
  the API; the new rank map is registered as a launcher would. Decisions waiting for a person are left waiting.
- A machine back from repair in the pool is reported back in service before any rank map places it, and its
  return gate's checks are answered (lab/evaluation/campaign_returns.py); a failed gate's eviction is acted on as
  any other.
- A fault is dealt with when the loop acted on its machine; a planned drain when the operator drained it (a
  silence on the node first); a user's bug when the user restarted the job (USER_FIX_S later); any other fault
  nobody dealt with in FAULT_TIMEOUT_S is drained by hand (a miss).
- STALE_AFTER_S after a fault was dealt with, its job's incidents opened since the fault that are still open are
  counted stale, unless their latest evidence came after a later fault's injection (the job crashed on the same bug
  again): then they are judged with that fault.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lab.evaluation import campaign_scoring as scoring
from lab.evaluation.campaign_checks import CheckDesk
from lab.evaluation.campaign_jobs import Active, CampaignJob
from lab.evaluation.campaign_report import campaign_report, scored
from lab.evaluation.campaign_returns import ReturnDesk
from lab.evaluation.report_files import hms
from lab.evaluation.soak import JobRun, Soak
from lab.evaluation.soak_agent import VirtualAgent
from lab.evaluation.soak_config import MAX_SIMULATED_S, SoakConfig, SoakJob
from lab.sim.actions import LOOP_KINDS, act
from lab.sim.config import SimConfig
from lab.sim.job import RESTART_PAUSE
from lab.sim.mix import LLAMA3_405B, SHARED_CATEGORY, Category, Draw, draws, spec_of
from lab.sim.model import Cluster
from lab.sim.pool import IN_JOB, REPAIR
from lab.sim.scenarios import FAULT_KINDS, SHARED_FAULT_KINDS
from service.config import Settings
from service.db import session_scope
from service.decisions.lifecycle import acknowledge
from service.jobs.schemas import JobIn, Parallelism, RankPlacement
from service.jobs.service import register
from service.models import Decision, Incident, Job, Node, SharedIncident
from service.security import Principal
from service.shared_causes import service as shared_causes
from service.silences import service as silences
from service.silences.schemas import SilenceIn

# One small job by default: a fault's whole cycle (detection, the loop, the restart) takes a few simulated
# minutes and the healthy stretches are short. The harness runs at ~20x real time per free core (measured 2-3x
# on the loaded dev VM), so 200 faults (~12 simulated hours) need a core to themselves for about 40 minutes.
DEFAULT_JOBS_SPEC = "4x2:tp2"
DEFAULT_FAULTS = 200
SPARES_PER_JOB = 2
HEALTHY_S = (45.0, 90.0)  # the healthy stretch before each fault, drawn uniformly
FAULT_TIMEOUT_S = 480.0  # a fault nobody acted on this long is drained by hand (4 cycles of the flapping straggler)
USER_FIX_S = 120.0  # a user's bug: the user reads the traceback, fixes the code and restarts the job
# A shared component's fault: its machines cordoned, the operator repairs it this long after (a switch swapped, a
# driver rolled back, the mount back), then puts the machines back.
COMPONENT_REPAIR_S = 60.0
REPAIR_S = 300.0  # an evicted machine is back in the spare pool this long after: a quick shop, so spares never run out
ACTOR = "faultline-campaign"
TIMELINE_GAP_S = 3600.0  # between two processes' simulated timelines (run_campaign)
# The policy's blast-radius rail (at most a share of a job's nodes evicted per hour) is sized for real fault rates:
# Llama 3's 2,048-node job lost a node every ~3 hours, far from 25% an hour. The campaign squeezes one fault
# every few minutes into a 4-node job, which would trip it on the second fault and leave every later eviction
# waiting for a person; so the campaign lifts it (the rail's own tests are in tests/service/decisions).
# Likewise the node cooldown (no second eviction of a node within 30 min): real repairs take hours, so a
# repaired machine is past it when it rejoins; the campaign's shop takes REPAIR_S, so the cooldown is scaled
# below that (a machine back from repair is a fresh one), and so is the node quarantine (1 h: an evicted node the
# shop gave back to the pool would otherwise fail to return when its stop-time checks pass).
# The fleet circuit breaker likewise (at most 10% of the fleet, at least 3 nodes, out by automatic decisions): the
# campaign keeps several of its few machines out at once by design; the breaker's own tests are in
# tests/service/breaker.
CAMPAIGN_POLICY = {
    "policy_max_evict_share_per_hour": 1000.0,
    "policy_node_cooldown_s": 0.8 * REPAIR_S,
    "node_quarantine_s": 0.8 * REPAIR_S,
    "breaker_enabled": False,
    # The escalation ladder too: the campaign draws independent faults back to back on the same few machines, minutes
    # apart, which the ladder would read as remedies that did not hold (its tests: tests/service/decisions/).
    "policy_ladder_enabled": False,
}
STALE_AFTER_S = scoring.STALE_AFTER_S


def _training(c: Cluster) -> bool:
    """The job trains (not failed, hung, or down for a restart); a checkpoint or an evaluation pause is training."""
    return c.job.state == "running" and c.job.pause != RESTART_PAUSE


class Campaign(Soak):
    """The campaign of some of the config's jobs (`indices`, default all) in this process."""

    def __init__(
        self,
        config: SoakConfig,
        settings: Settings,
        *,
        faults: int,
        say: Callable[[str], None],
        indices: list[int] | None = None,
        mix: tuple[Category, ...] = LLAMA3_405B,
        service_checks: bool = True,
        shared_rate: float = 0.0,
    ) -> None:
        self.service_checks = service_checks
        # The share of draws that is a shared component's fault (a leaf switch, a driver rollout, a storage outage,
        # a rack's power: lab/sim/shared_faults.py), the kinds in turn.
        self.shared_rate = shared_rate  # False: the placeholder check, as before issue 28 (a baseline)
        # model_copy: the rail's field is validated <= 1 for operators; the campaign's value is deliberate.
        super().__init__(config, settings.model_copy(update=CAMPAIGN_POLICY), say=say, indices=indices)
        self.total_faults, self.mix = faults, mix
        # A shared cause has its component and machines to name: localizable.
        self.localizable = frozenset(c.name for c in mix if c.localizable) | {SHARED_CATEGORY}
        self.mix_name = "Llama 3 405B" if mix == LLAMA3_405B else "given"
        self.campaign: list[CampaignJob] = []
        self.outcomes: list[scoring.FaultOutcome] = []
        self.decision_rows: dict[int, scoring.DecisionRow] = {}
        self.incident_rows: dict[int, scoring.IncidentRow] = {}
        self.shared_rows: dict[int, scoring.SharedIncidentRow] = {}
        self._cordoned_at: dict[int, float] = {}  # a shared fault's index -> when its machines were all cordoned
        self.stale: dict[int, list[int]] = {}  # fault index -> its stale incidents
        self.loop_acts: list[dict[str, Any]] = []
        # Every job draws its share of the faults: job k the k-th, (k + jobs)-th, ... of the campaign.
        self.quota = {i: len(range(i, faults, len(config.jobs))) for i in self.indices}

    # -- set-up --

    def _sim_config(self, i: int, spec: SoakJob, job_id: str) -> SimConfig:
        return SimConfig(
            nodes=spec.nodes,
            gpus_per_node=spec.gpus_per_node,
            spares=SPARES_PER_JOB,
            repair_seconds=REPAIR_S,
            scenario="healthy",
            seed=self.config.seed * 1000 + i,
            job_id=job_id,
            node_prefix=f"camp{self.run_id}{spec.name}-",
            start=self.start,
            realism=True,
            realism_params=self.config.realism,
            agents=False,
            service_checks=self.service_checks,
        )

    def _make_jobs(self, session: Session) -> None:
        for i in self.indices:
            spec = self.config.jobs[i]
            job_id = f"campaign-{self.run_id}-{spec.name}"
            cluster = Cluster(self._sim_config(i, spec, job_id))
            agents = [
                VirtualAgent(cluster, n, job_id=job_id, tree_dir=self.tree_dir, pid_base=100_000 * (i + 1))
                for n in range(cluster.machines)
            ]
            run = JobRun(spec, job_id, cluster, agents)
            self._register(session, run, self.start)
            for n, agent in enumerate(agents):
                if cluster.agent_delay(n) <= 0:
                    agent.start(self.start)
            self._sync_pids(run)
            self.jobs.append(run)
            rng = random.Random(self.config.seed * 7919 + i)
            stream = draws(
                self.config.seed * 104729 + i,
                nodes=spec.nodes,
                gpus_per_node=spec.gpus_per_node,
                mix=self.mix,
                shared_rate=self.shared_rate,
            )
            self.campaign.append(
                CampaignJob(
                    run, stream, rng, next_at=rng.uniform(*HEALTHY_S), first_step=cluster.job.step,
                    step_s=cluster.config.step_seconds, returns=ReturnDesk(self.settings, job_id=job_id),
                    desk=CheckDesk(self.settings, job_id=job_id, seconds=cluster.config.check_seconds)
                    if self.service_checks else None,
                )
            )  # fmt: skip

    def _register(self, session: Session, run: JobRun, now: datetime) -> None:
        """The job with its current rank map, as its launcher registers it at each (re)start."""
        spec, c = run.spec, run.cluster
        register(
            session,
            now=now,
            job_in=JobIn(
                job_id=run.job_id,
                world_size=c.world,
                parallelism=Parallelism(tp=spec.tp, pp=spec.pp, dp=c.world // (spec.tp * spec.pp)),
                hang_timeout_s=self.config.hang_timeout_s,
                ranks=[RankPlacement(**r) for r in c.rank_map()],
            ),
        )

    # -- the loop --

    def _banner(self) -> str:
        shape = ", ".join(
            f"{j.job_id} ({j.spec.nodes}x{j.spec.gpus_per_node}, tp {j.spec.tp} pp {j.spec.pp})" for j in self.jobs
        )
        return f"campaign: {sum(self.quota.values())} faults from the {self.mix_name} mix on {shape}"

    def _tick(self, t: float, now: datetime) -> None:
        for job in self.campaign:
            self._step(job, t, now)
            if job.desk is not None and job.desk.busy(t):
                with session_scope() as session:  # the checks' results, in-process at simulated time
                    for decision_id in job.desk.tick(session, job.run.cluster, t=t, now=now):
                        job.run.decision_times.setdefault(decision_id, t)  # the next pass acts on them
            if job.returns.gates_due(t):
                with session_scope() as session:  # the return gates' results (a failure's eviction: acted on next)
                    for decision_id in job.returns.deliver_due(session, job.run.cluster, t=t, now=now):
                        job.run.decision_times.setdefault(decision_id, t)

    def _finished(self) -> bool:
        return all(self._job_finished(j) for j in self.campaign)

    def report(self) -> dict[str, Any]:
        return campaign_report(
            self.campaign,
            outcomes=self.outcomes,
            stale=self.stale,
            decision_rows=self.decision_rows,
            incident_rows=self.incident_rows,
            shared_rows=self.shared_rows,
            loop_acts=self.loop_acts,
            spares=SPARES_PER_JOB,
            seed=self.config.seed,
            start=self.start,
            covered_s=self.covered_s,
            wall_s=self.wall_s,
        )

    def _job_finished(self, job: CampaignJob) -> bool:
        i = self.jobs.index(job.run)
        done = sum(1 for o in self.outcomes if o.job_id == job.run.job_id)
        checking = job.desk is not None and bool(job.desk.pending)  # a diagnosed machine's checks still running
        checking = checking or bool(job.returns.pending)  # or a returned machine's gate
        return done >= self.quota[self.indices[i]] and job.active is None and not job.stale_checks and not checking

    def _progress(self, t: float, started: float) -> None:
        wall = time.monotonic() - started
        total = sum(self.quota.values())
        self.say(
            f"campaign: {len(self.outcomes)}/{total} faults dealt with, {hms(t)} simulated in {wall / 60:.1f} min "
            f"({t / wall if wall else 0:.0f}x real time); {len(self.decision_rows)} decisions, "
            f"{len(self.incident_rows)} incidents"
        )

    def _advance(self, run: JobRun, t: float, now: datetime) -> None:
        super()._advance(run, t, now)
        job = next(j for j in self.campaign if j.run is run)
        moved = run.cluster.slots_version != job.slots_version  # the job restarted on other machines
        if job.returns.watch(run.cluster, t) or moved:
            with session_scope() as session:
                # As a scheduler does: a machine back in service (from the repair shop) is reported before a rank
                # map places it, so the service runs its return gate instead of finding work on a quarantined node.
                reported = job.returns.sweep(session, run.cluster, t=t, now=now)
                if moved:
                    job.slots_version = run.cluster.slots_version
                    self._register(session, run, now)
                    job.returns.expect_gates(session, run.cluster, t=t, how="placed_before_gate")
            if reported:
                self.say(f"campaign: t={hms(t)} {run.job_id}: reported {', '.join(reported)} back in service")
            if moved:
                self._start_agents(run, now)
        self._shop_agents(job, now)

    @staticmethod
    def _shop_agents(job: CampaignJob, now: datetime) -> None:
        """A machine in the repair shop is down (reimaged, parts swapped): its agent ships nothing until the machine
        is back in the spare pool."""
        c = job.run.cluster
        for m, agent in enumerate(job.run.agents):
            if c.place[m] == REPAIR and agent.running:
                agent.stop("TERM")
                job.in_shop.add(m)
            elif c.place[m] != REPAIR and m in job.in_shop:
                job.in_shop.discard(m)
                agent.start(now)

    @staticmethod
    def _start_agents(run: JobRun, now: datetime) -> None:
        """A machine swapped into the job has its agent running already (it ran as a spare); one that never ran
        starts now."""
        for agent in run.agents:
            if not agent.ever_started:
                agent.start(now)

    # -- one job's faults --

    def _step(self, job: CampaignJob, t: float, now: datetime) -> None:
        for when, index in list(job.stale_checks):
            if t >= when:
                job.stale_checks.remove((when, index))
                self._check_stale(job, index, now)
        a = job.active
        if a is None:
            i = self.indices[self.jobs.index(job.run)]
            mine = sum(1 for o in self.outcomes if o.job_id == job.run.job_id)
            if t >= job.next_at and mine < self.quota[i] and _training(job.run.cluster):
                self._inject(job, t, now)
            return
        if a.dealt_t is None:
            self._maybe_dealt(job, a, t, now)
        elif _training(job.run.cluster) or t - a.dealt_t >= FAULT_TIMEOUT_S:
            self._close(job, a, t)

    def _inject(self, job: CampaignJob, t: float, now: datetime) -> None:
        c = job.run.cluster
        d: Draw = next(job.draws)
        if d.kind in SHARED_FAULT_KINDS and not c.component_fault_ready(d.kind):
            # The job has too few machines behind any one switch or rack now (its spares took their places): the
            # dataset's storage fails instead, which every machine of the job mounts.
            d = replace(d, kind="storage_outage")
        spec = spec_of(d, t)
        node = c.node_names[c.slots[d.node]] if spec.node is not None else None
        if d.kind == "host_maintenance":  # the operator silences the node before draining it
            self._silence(node, now)
        record = c.inject(spec)
        index = job.count * len(self.config.jobs) + self.indices[self.jobs.index(job.run)]
        job.count += 1
        job.active = Active(
            index, d, spec, record, node, t, c.job.step, since_checkpoint_s=self._since_checkpoint(c, job.step_s)
        )
        self.say(
            f"campaign: t={hms(t)} {job.run.job_id}: fault #{index} {d.kind} ({d.category}) on {node or 'the job'}"
        )
        if d.kind == "host_maintenance":  # the injection drained it (a spare took its place)
            self._dealt(job.active, t, "drained")

    @staticmethod
    def _since_checkpoint(c: Cluster, step_s: float) -> float:
        """Seconds of training a restart now would redo: the steps since the checkpoint it resumes from."""
        return max(0, c.job.step - c.job.last_checkpoint) * step_s

    def _silence(self, node: str | None, now: datetime) -> None:
        if node is None:
            return
        with session_scope() as session:
            silences.create(
                session,
                silence_in=SilenceIn(
                    # As long as the maintenance (the machine is in the shop REPAIR_S): an operator's silence
                    # that outlived it hid the machine's next real fault once it was back in a job.
                    node_pattern=node,
                    duration_s=REPAIR_S,
                    author=ACTOR,
                    comment="planned maintenance (campaign)",
                ),
                principal=Principal(token_id=0, scope="operator", node_name=None, name=ACTOR, expires_at=None),
                now=now,
            )

    def _maybe_dealt(self, job: CampaignJob, a: Active, t: float, now: datetime) -> None:
        kind = FAULT_KINDS[a.draw.kind]
        c = job.run.cluster
        if a.draw.kind in SHARED_FAULT_KINDS:
            self._maybe_component_dealt(job, a, t, now)
            return
        if a.record.resolved_by or a.record.repaired_at is not None:  # the loop took it out of the job, or reset it
            self._dealt(a, t, "acted")
        elif kind.scope == "job" and t - a.t >= USER_FIX_S:
            c.repair(a.record)  # the user fixed the code and restarted the job
            self._dealt(a, t, "restarted")
        elif t - a.t >= FAULT_TIMEOUT_S:
            machine = c.machine_index(a.node) if a.node else None
            if machine is not None and c.node_rank(machine) is not None:
                c.swap_out(machine, then=REPAIR)  # nobody acted: an operator drains it by hand
            else:
                c.repair(a.record)
            self._dealt(a, t, "by_hand")

    def _maybe_component_dealt(self, job: CampaignJob, a: Active, t: float, now: datetime) -> None:
        """A shared component's fault is dealt with once the loop cordoned every machine of it (the service's decision
        for the component) and, COMPONENT_REPAIR_S later, the operator repaired the component (the switch replaced,
        the driver rolled back), closed its shared incident and put the machines back, which the scheduler reports
        back in service (their return gate). Nobody cordoned them within FAULT_TIMEOUT_S: repaired all the same."""
        c = job.run.cluster
        machines = (a.record.details or {}).get("machines", [])
        cordoned = all(m in c.cordoned or c.place[m] != IN_JOB for m in machines)
        if cordoned:
            self._cordoned_at.setdefault(a.index, t)
        if (not cordoned or t - self._cordoned_at[a.index] < COMPONENT_REPAIR_S) and t - a.t < FAULT_TIMEOUT_S:
            return
        if c.vacant:
            return  # a machine left the job meanwhile and no spare is free: the job restarts once one is
        c.repair(a.record)
        for m in machines:
            c.put_back(m)
        details = a.record.details or {}
        with session_scope() as session:
            incident_id = session.scalar(
                select(SharedIncident.id).where(
                    SharedIncident.component_kind == details.get("component_kind"),
                    SharedIncident.component == details.get("component"),
                    SharedIncident.state == "open",
                )
            )
            if incident_id is not None:
                shared_causes.resolve_by_hand(
                    session, incident_id=incident_id, reason="component repaired (campaign)", actor=ACTOR, now=now
                )
        self._dealt(a, t, "acted" if cordoned else "by_hand")

    @staticmethod
    def _dealt(a: Active, t: float, how: str) -> None:
        a.dealt_t, a.how = t, how

    def _close(self, job: CampaignJob, a: Active, t: float) -> None:
        """The job runs again after the fault: its outcome, then the next healthy stretch."""
        assert a.dealt_t is not None
        job.active = None
        job.next_at = t + job.rng.uniform(*HEALTHY_S)
        job.stale_checks.append((a.dealt_t + STALE_AFTER_S, a.index))
        c = job.run.cluster
        lost = max(0.0, (t - a.t) - (c.job.step - a.step) * job.step_s)
        ideal = self.config_restart_s(c) + a.since_checkpoint_s
        self.outcomes.append(
            scoring.FaultOutcome(
                index=a.index,
                job_id=job.run.job_id,
                category=a.draw.category,
                kind=a.draw.kind,
                node=a.node,
                gpu=a.draw.gpu,
                expect_action=FAULT_KINDS[a.draw.kind].action,
                eviction_optional=FAULT_KINDS[a.draw.kind].eviction_optional,
                localizable=a.draw.category in self.localizable,
                # When the fault struck: the record's time, which a fault that comes some seconds into its setting
                # (fault_in_checkpoint: the GPU drops 3-8 s into the save) moves to that moment (issue 44).
                injected_s=max(a.t, a.record.t),
                dealt_s=a.dealt_t,
                how=a.how,
                lost_s=round(lost, 1),
                ideal_lost_s=round(min(lost, ideal), 1),
                **self._component_of(a),
            )
        )

    @staticmethod
    def _component_of(a: Active) -> dict[str, Any]:
        """A shared component's fault: its machines and the component, for the scoring."""
        if a.draw.kind not in SHARED_FAULT_KINDS:
            return {}
        details = a.record.details or {}
        return {
            "members": tuple(a.record.nodes),
            "component_kind": str(details.get("component_kind", "")),
            "component": str(details.get("component", "")),
        }

    @staticmethod
    def config_restart_s(c: Cluster) -> float:
        return float(c.config.restart_seconds)

    def _check_stale(self, job: CampaignJob, index: int, now: datetime) -> None:
        outcome = next(o for o in self.outcomes if o.index == index)
        since = self.start + timedelta(seconds=outcome.injected_s - scoring.CLOCK_SLACK_S)
        theirs = [
            i for i, r in self.incident_rows.items()
            if r.job_id == job.run.job_id and r.first_seen_s >= (since - self.start).total_seconds()
            and r.first_seen_s <= outcome.dealt_s + scoring.GRACE_S
        ]  # fmt: skip
        theirs += job.carried.pop(index, [])
        if not theirs:
            return
        with session_scope() as session:
            # updated_at: the incident's latest evidence (it moves on nothing else)
            still = session.execute(
                select(Incident.id, Incident.updated_at).where(Incident.id.in_(theirs), Incident.state != "resolved")
            ).all()
        stale = []
        for incident_id, latest in still:
            later = self._later_fault(job, after=outcome.injected_s, by=(latest - self.start).total_seconds())
            if later is None:
                stale.append(incident_id)
            else:  # it holds a later fault's evidence (the job crashed on the same bug again): judged with that one
                job.carried.setdefault(later, []).append(incident_id)
        if stale:
            self.stale[index] = sorted(stale)

    def _later_fault(self, job: CampaignJob, *, after: float, by: float) -> int | None:
        """The job's latest fault injected after `after` and by `by` (seconds into the campaign), if any."""
        injected = [(o.injected_s, o.index) for o in self.outcomes if o.job_id == job.run.job_id]
        if job.active is not None:
            injected.append((job.active.t, job.active.index))
        later = [(t, i) for t, i in injected if after < t <= by + scoring.CLOCK_SLACK_S]
        return max(later)[1] if later else None

    # -- the service's answers: the loop acts on decisions --

    def _pass(self, run: JobRun, now: datetime, *, fast: bool) -> None:
        super()._pass(run, now, fast=fast)
        job = next(j for j in self.campaign if j.run is run)
        t = (now - self.start).total_seconds()
        mine = set(run.cluster.node_names)
        with session_scope() as session:
            self._note_incidents(session, job, t)
            # A shared component's cordons are decided by whichever job's pass saw the group form: the scheduler of
            # the machines acts on them (the other process's pass may have made them).
            for decision_id in session.scalars(
                select(Decision.id)
                .join(Node, Node.id == Decision.node_id)
                .where(
                    Decision.shared_incident_id.is_not(None),
                    Node.name.in_(mine),
                    Decision.id.not_in(job.decided or {0}),
                )
            ):
                run.decision_times.setdefault(decision_id, t)
            new = [d for d in run.decision_times if d not in job.decided]
            if not new:
                return
            rows = session.execute(
                select(Decision, Node.name).outerjoin(Node, Node.id == Decision.node_id).where(Decision.id.in_(new))
            ).all()
            for decision, node in sorted(rows, key=lambda r: r[0].id):
                job.decided.add(decision.id)
                if node is not None and node not in mine:
                    continue  # another job's machine (a shared cordon this pass made): its own process acts on it
                self.decision_rows[decision.id] = scoring.DecisionRow(
                    decision.id,
                    run.job_id,
                    run.decision_times[decision.id],
                    decision.kind,
                    node,
                    decision.gpu,
                    awaited_approval=decision.state == "awaiting_approval",
                    by_checks_of=job.desk.remedies.get(decision.id) if job.desk is not None else None,
                )
                if decision.state != "pending" or decision.kind not in LOOP_KINDS:
                    continue  # waiting for a person, or a job-level decision no node scheduler acts on
                outcome = act(run.cluster, {"kind": decision.kind, "node": node, "gpu": decision.gpu})
                acknowledge(
                    session,
                    decision_id=decision.id,
                    outcome=outcome.ack,
                    message=outcome.message,
                    actor=ACTOR,
                    now=now,
                    settings=self.settings,
                )
                if job.desk is not None and decision.kind == "diagnose" and outcome.done:
                    job.desk.after_ack(session, run.cluster, decision_id=decision.id, node=node, t=t)
                self.loop_acts.append(
                    {"t_s": t, "decision": decision.id, "kind": decision.kind, "node": node, "ack": outcome.ack,
                     "message": outcome.message}
                )  # fmt: skip

    def _note_incidents(self, session: Session, job: CampaignJob, t: float) -> None:
        pk = session.scalar(select(Job.id).where(Job.external_id == job.run.job_id))
        rows = session.execute(
            select(Incident.id, Incident.blame, Incident.silence_id).where(
                Incident.job_id == pk, Incident.id > job.seen_incident
            )
        ).all()
        for incident_id, blame, silence_id in rows:
            job.seen_incident = max(job.seen_incident, incident_id)
            self.incident_rows[incident_id] = scoring.IncidentRow(
                incident_id, job.run.job_id, t, blame, silenced=silence_id is not None
            )
        # Shared incidents naming this job's machines (the cluster's names carry the job's prefix).
        names = set(job.run.cluster.node_names)
        for s in session.scalars(select(SharedIncident).where(SharedIncident.id.not_in(self.shared_rows or [0]))):
            members = tuple(str(m.get("node")) for m in s.members or [])
            if names.isdisjoint(members):
                continue
            self.shared_rows[s.id] = scoring.SharedIncidentRow(
                s.id, job.run.job_id, t, s.component_kind, s.component, members
            )
        # A rival blamed on a pass's partial evidence and superseded a pass later by the better explanation.
        superseded = session.scalars(
            select(SharedIncident.id).where(
                SharedIncident.id.in_([i for i, r in self.shared_rows.items() if not r.superseded] or [0]),
                SharedIncident.resolution.like("superseded by %"),
            )
        )
        for shared_id in superseded:
            self.shared_rows[shared_id] = replace(self.shared_rows[shared_id], superseded=True)


def run_campaign(
    config: SoakConfig,
    settings: Settings,
    *,
    faults: int,
    say: Callable[[str], None],
    processes: int,
    mix: tuple[Category, ...] = LLAMA3_405B,
    service_checks: bool = True,
    shared_rate: float = 0.0,
) -> dict[str, Any]:
    """Every job of the config, spread over `processes` worker processes; one scored report."""
    groups = [list(range(len(config.jobs)))[k::processes] for k in range(min(processes, len(config.jobs)))]
    if len(groups) == 1:
        return scored(
            Campaign(
                config, settings, faults=faults, say=say, mix=mix, service_checks=service_checks,
                shared_rate=shared_rate,
            ).run()
        )  # fmt: skip
    # Each process keeps a simulated clock of its own, and the service reads the fleet's findings by time (shared
    # causes): laid end to end, the processes' timelines never put one job's findings inside another's window at
    # another simulated moment (the clocks drift apart by hours over a campaign).
    span = config.duration_s + TIMELINE_GAP_S
    shift = span if len(groups) * span <= MAX_SIMULATED_S else 0.0
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no engine or pool inherited
    with ProcessPoolExecutor(max_workers=len(groups), mp_context=context) as pool:
        args = [
            (replace(config, start=config.start - timedelta(seconds=k * shift)), settings, faults, say, g, mix,
             service_checks, shared_rate)
            for k, g in enumerate(groups)
        ]  # fmt: skip
        futures = [pool.submit(_run_group, a) for a in args]
        try:
            parts = [f.result() for f in futures]
        except KeyboardInterrupt:
            # A SIGTERM (kill, a timeout) reaches this process only, a Ctrl-C the whole group: the workers are told
            # too, or leaving the pool waits for their whole campaigns.
            for worker in list((pool._processes or {}).values()):
                if worker.pid is not None and worker.is_alive():
                    os.kill(worker.pid, signal.SIGINT)
            raise
    merged = {
        **parts[0],
        "wall_s": max(p["wall_s"] for p in parts),
        "simulated_s": max(p["simulated_s"] for p in parts),
    }
    keys = ("jobs", "progress", "faults", "decisions", "incidents", "shared_incidents", "loop_acts", "checks")
    for key in (*keys, "returns", "returns_refused", "gates", "node_ends", "node_notes"):
        merged[key] = [item for p in parts for item in p[key]]
    return scored(merged)


def _run_group(
    args: tuple[SoakConfig, Settings, int, Callable[[str], None], list[int], tuple[Category, ...], bool, float],
) -> dict[str, Any]:
    config, settings, faults, say, indices, mix, service_checks, shared_rate = args
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return Campaign(
        config, settings, faults=faults, say=say, indices=indices, mix=mix, service_checks=service_checks,
        shared_rate=shared_rate,
    ).run()  # fmt: skip


def default_duration(faults: int, jobs: int) -> float:
    """A bound on the simulated time: every fault at its longest (a timeout, the healthy stretch, a restart)."""
    per_fault = HEALTHY_S[1] + FAULT_TIMEOUT_S + 120.0
    return min(MAX_SIMULATED_S, per_fault * -(-faults // max(1, jobs)) + STALE_AFTER_S)
