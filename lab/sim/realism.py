"""Real-life healthy behaviour of a training job, mixed into the cluster model (lab/sim/model.py).

Two parts:
- the job's pauses, which faults use too (a fault during a checkpoint, a hang inside one): a checkpoint save
  (every rank stops stepping for tens of seconds, copies its state to the host, the storage NIC writes), an
  evaluation (forward-only steps in their own rhythm, then Megatron's validation line), a restart from the
  last checkpoint (processes exit and come back, steps repeat), a data-loader stall on one rank;
- the noise itself, on only with realism (SimConfig.realism or a scenario's): those pauses on their
  schedules, learning-rate warmup, loss spikes, per-node speed, thermal drift over a day, late and restarting
  agents, clock skew. It draws from a random stream of its own, so with realism off nothing changes.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from lab.sim import logformat as fmt
from lab.sim.config import RealismParams, SimConfig
from lab.sim.fabric import Fabric
from lab.sim.gpu import COMM, COMPUTE, IDLE, NONE, SAVE, Gpu
from lab.sim.host import Host
from lab.sim.job import CHECKPOINT_PAUSE, EVAL_PAUSE, LOAD_PAUSE, RESTART_PAUSE, Job
from lab.sim.modes import CHECKPOINT, CULPRIT_CKPT, CULPRIT_DATA, NORMAL, TERMINATED
from lab.sim.scenarios import FaultSpec

# A restart reads the checkpoint back at this rate per node; a forced checkpoint (a fault's) lasts this long.
CHECKPOINT_READ_BYTES_PER_S = 4e9
FORCED_CHECKPOINT_S = (25.0, 35.0)
# No job event (restart, evaluation, stall) starts this close before a planned fault: the fault's scene stays
# the one its scenario describes.
FAULT_GUARD_S = 60.0
# A late agent's first start reads the logs from their end, as agents do: it must be up this long before a
# planned fault, or the fault's lines would be lost to it (the scenario would change).
LATE_JOIN_MARGIN_S = 15.0
SEED_SALT = 0x4EA1
# Of an evaluation step: the forward pass, then the exchange of its outputs (pipeline, tensor parallel, the loss).
EVAL_COMPUTE_SHARE = 0.7
START, STOP = "start", "stop"


@dataclass(frozen=True)
class AgentAction:
    """Something the runner does to a node's agent process: start it, or stop it with TERM or KILL."""

    t: float
    node: int
    action: str  # START | STOP
    signal: str = ""  # TERM | KILL, for STOP


@dataclass
class RealState:
    """The realism's own schedule and draws; absent (None) when realism is off."""

    params: RealismParams
    rng: random.Random
    speed: list[float]  # per node: compute speed factor (1.0 = nominal)
    rack_c: list[float]  # per node: inlet temperature offset (its place in the room)
    late: dict[int, float]  # node -> when its agent first starts
    waiting: set[int]  # late nodes whose agent has not started yet
    agent_back: dict[int, float]  # node -> when its stopped agent starts again
    next_agent_restart: list[float]
    next_checkpoint: float
    next_eval: float
    next_restart: float
    next_stall: float
    next_spike: float
    events: list[dict[str, Any]] = field(default_factory=list)


class RealLife:
    """Cluster's pauses and real-life noise; the state is the cluster's (see FaultInjection for the pattern)."""

    config: SimConfig
    rng: random.Random
    start: datetime
    node_names: list[str]
    gpn: int
    world: int
    gpus: list[list[Gpu]]
    hosts: list[Host]
    fabrics: list[Fabric]
    modes: list[str]
    job: Job
    generation: int
    control_version: int
    faults_version: int
    t: float
    real: RealState | None
    skew: list[timedelta]
    agent_actions: list[AgentAction]
    _next_fault: FaultSpec | None
    slots: list[int]

    if TYPE_CHECKING:

        def _ts(self, offset: float = 0.0) -> datetime: ...
        def _train(self, node: int, lines: list[str]) -> None: ...
        def _set_mode(self, rank: int, mode: str) -> None: ...
        def _plan_step(self) -> None: ...
        def _pid(self, rank: int) -> int: ...
        def _launcher_pid(self, node: int) -> int: ...
        def _hang_job(self, culprits: dict[int, str], watchdog: float) -> None: ...
        def machine_of(self, rank: int) -> int: ...
        def ranks_on(self, node: int) -> list[int]: ...

    # --- setup ---

    def _start_realism(self, params: RealismParams) -> RealState:
        """Draw the per-node traits and the first time of everything, in a fixed order (deterministic per seed)."""
        assert self.config.seed is not None
        rng = random.Random(self.config.seed ^ SEED_SALT)
        p, nodes = params, self.config.machines
        skew = [
            max(-p.clock_skew_max_s, min(p.clock_skew_max_s, rng.gauss(0, p.clock_skew_sd_s))) for _ in range(nodes)
        ]
        self.skew = [timedelta(seconds=round(s, 3)) for s in skew]
        speed = [
            1.0 + max(-p.node_speed_max, min(p.node_speed_max, rng.gauss(0, p.node_speed_sd))) for _ in range(nodes)
        ]
        rack_c = [rng.uniform(-1.0, 1.0) for _ in range(nodes)]
        late_nodes = rng.sample(range(nodes), min(p.late_join_nodes, max(0, nodes - 1)))
        late = {n: rng.uniform(*p.late_join_s) for n in sorted(late_nodes)}
        if self._next_fault is not None:  # a first start reads logs from their end: join before the fault, or not late
            late = {n: at for n, at in late.items() if at <= self._next_fault.at - LATE_JOIN_MARGIN_S}
        return RealState(
            params=p,
            rng=rng,
            speed=speed,
            rack_c=rack_c,
            late=late,
            waiting=set(late),
            agent_back={},
            next_agent_restart=[late.get(n, 0.0) + _gap(rng, p.agent_restart_every_s) for n in range(nodes)],
            next_checkpoint=_first(p.checkpoint_every_s, rng.uniform(0.3, 1.0)),
            next_eval=_first(p.eval_every_s, rng.uniform(0.5, 1.0)),
            next_restart=p.first_restart_s or max(FAULT_GUARD_S, _gap(rng, p.restart_every_s)),
            next_stall=_gap(rng, p.loader_stall_every_s),
            next_spike=_gap(rng, p.loss_spike_every_s),
        )

    def _fresh_job(self) -> None:
        """With realism the job has just started: iteration 0, its learning rate warming up."""
        job = self.job
        job.step = job.last_checkpoint = 0
        job.seq = 17

    def agent_delay(self, node: int) -> float:
        """Seconds after the start when the node's agent first runs (a node joining late); 0 for most."""
        return self.real.late.get(node, 0.0) if self.real else 0.0

    def take_agent_actions(self) -> list[AgentAction]:
        """The agent starts and stops due so far, for the runner to carry out; each is handed out once."""
        out, self.agent_actions = self.agent_actions, []
        return out

    def realism_truth(self) -> dict[str, Any]:
        real = self.real
        assert real is not None
        names = self.node_names
        return {
            "params": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(real.params).items()},
            "clock_skew_s": {names[n]: s.total_seconds() for n, s in enumerate(self.skew)},
            "node_speed": {names[n]: round(v, 4) for n, v in enumerate(real.speed)},
            "late_agents": {names[n]: round(t, 1) for n, t in real.late.items()},
            "events": real.events,
        }

    # --- per tick ---

    def _node_ts(self, node: int, offset: float = 0.0) -> datetime:
        """The time as the node's own clock shows it (skewed with realism)."""
        return self._ts(offset) + self.skew[node]

    def _tick_pauses(self) -> None:
        """End a pause or a loader stall whose time has come (with or without realism: faults use them too)."""
        job = self.job
        if job.stall_rank is not None and self.t >= job.stall_until - 1e-9:
            if self.modes[job.stall_rank] == CULPRIT_DATA:
                self._set_mode(job.stall_rank, NORMAL)
            job.stall_rank = None
        if not job.pause:
            return
        if job.state != "running":  # the job died mid-pause (every rank crashed): its save or load ends with it
            self._stop_pause()
            return
        if self.t < job.pause_until - 1e-9:
            return
        ending = job.pause
        if ending == CHECKPOINT_PAUSE:
            self._end_checkpoint()
        elif ending == EVAL_PAUSE:
            self._end_eval()
        elif ending == RESTART_PAUSE:
            self._end_restart()
        else:
            self._resume()

    def _pause_activity(self) -> str:
        """What a normal rank's GPU does while the job is paused."""
        job = self.job
        if job.pause == CHECKPOINT_PAUSE:
            return SAVE
        if job.pause == EVAL_PAUSE:
            step = self.config.step_seconds * self.config.realism_params.eval_step_share
            into = (self.t - job.pause_started) % step
            return COMPUTE if into < EVAL_COMPUTE_SHARE * step else COMM
        return IDLE if job.pause == LOAD_PAUSE else NONE

    def _realism_tick(self) -> None:
        real = self.real
        assert real is not None
        t, p = self.t, real.params
        self._agent_tick(real)
        if not self._quiet():
            return
        if t >= real.next_restart:
            real.next_restart = t + max(FAULT_GUARD_S, _gap(real.rng, p.restart_every_s))
            self._begin_restart(real.rng.uniform(*p.restart_down_s))
        elif t >= real.next_stall:
            real.next_stall = t + _gap(real.rng, p.loader_stall_every_s)
            rank = real.rng.randrange(self.world)
            seconds = real.rng.uniform(*p.loader_stall_s)
            self._loader_stall(rank, seconds)
            node = self.node_names[self.machine_of(rank)]
            self._note("loader_stall", node=node, rank=rank, seconds=round(seconds, 2))

    def _after_step(self) -> None:
        """At a step boundary: a due checkpoint or evaluation starts here, as trainers run them between steps."""
        real = self.real
        if real is None or not self._quiet():
            return
        t, p, job = self.t, real.params, self.job
        if t >= real.next_spike:
            real.next_spike = t + _gap(real.rng, p.loss_spike_every_s)
            job.loss_spike = real.rng.uniform(*p.loss_spike_factor) - 1.0
            self._note("loss_spike", iteration=job.step + 1, factor=round(1.0 + job.loss_spike, 3))
        if t >= real.next_checkpoint:
            while real.next_checkpoint <= t:
                real.next_checkpoint += p.checkpoint_every_s
            self._begin_checkpoint(real.rng.uniform(*p.checkpoint_s))
        elif t >= real.next_eval:
            while real.next_eval <= t:
                real.next_eval += p.eval_every_s
            self._begin_eval()

    def _node_second(self) -> None:
        """Once a simulated second: the inlet air drifts over the day (peak mid-afternoon), per node's rack."""
        real = self.real
        if real is None:
            return
        day = real.params.day_s
        seconds = (self.start.timestamp() + self.t) % day
        swing = real.params.thermal_drift_c * math.cos(2 * math.pi * (seconds / day - 15 / 24))
        for n, gpus in enumerate(self.gpus):
            for g in gpus:
                g.ambient = swing + real.rack_c[n]

    def _quiet(self) -> bool:
        """Whether the job is training undisturbed: no pause, stall, fault in play, nor a fault about to come."""
        job = self.job
        if job.state != "running" or job.pause or job.stall_rank is not None or self.t < job.stall_until:
            return False
        if self._next_fault is not None and self._next_fault.at - self.t < FAULT_GUARD_S:
            return False
        return all(m == NORMAL for m in self.modes)

    def _note(self, kind: str, **details: Any) -> None:
        event = {"kind": kind, "t": round(self.t, 2), "at": self._ts().isoformat(), **details}
        if self.real is not None:
            self.real.events.append(event)
            self.faults_version += 1  # the runner rewrites the ground truth on this

    # --- agents ---

    def _agent_tick(self, real: RealState) -> None:
        t, p = self.t, real.params
        for n in sorted(real.waiting):
            if t >= real.late[n]:
                real.waiting.discard(n)
                self.agent_actions.append(AgentAction(t, n, START))
                self._note("agent_late_start", node=self.node_names[n])
        for n, at in list(real.agent_back.items()):
            if t >= at:
                del real.agent_back[n]
                self.agent_actions.append(AgentAction(t, n, START))
                self._note("agent_start", node=self.node_names[n])
        for n in range(len(real.next_agent_restart)):
            if t >= real.next_agent_restart[n] and n not in real.agent_back and n not in real.waiting:
                sig = "KILL" if real.rng.random() < p.agent_kill_share else "TERM"
                down = real.rng.uniform(*p.agent_down_s)
                real.agent_back[n] = t + down
                real.next_agent_restart[n] = t + down + _gap(real.rng, p.agent_restart_every_s)
                self.agent_actions.append(AgentAction(t, n, STOP, sig))
                self._note("agent_stop", node=self.node_names[n], signal=sig, down_s=round(down, 2))

    # --- the pauses ---

    def _begin_checkpoint(self, seconds: float, stuck_rank: int | None = None) -> None:
        """Every rank saves its shard: no steps, GPUs copying to the host, the storage NIC writing."""
        job = self.job
        job.pause, job.pause_started, job.pause_until = CHECKPOINT_PAUSE, self.t, self.t + seconds
        job.stuck_rank = stuck_rank
        for r in range(self.world):
            if self.modes[r] == NORMAL:
                self._set_mode(r, CULPRIT_CKPT if r == stuck_rank else CHECKPOINT)
        rate = self.config.realism_params.checkpoint_write_bytes_per_s
        for fabric, host in zip(self.fabrics, self.hosts, strict=True):
            fabric.storage_write = rate
            host.io_load = 1.0
        self._train(0, [fmt.megatron_saving(job.step)])
        self._note("checkpoint", iteration=job.step, seconds=round(seconds, 2))

    def _end_checkpoint(self) -> None:
        job = self.job
        if job.stuck_rank is not None:  # one rank never returns from its write: the rest wait in the barrier
            self._hang_job({job.stuck_rank: CULPRIT_CKPT}, self.config.hang_watchdog_seconds)
            return
        took_ms = (self.t - job.pause_started) * 1000
        spread = took_ms * (0.97 + 0.02 * self.rng.random())
        self._train(0, [fmt.megatron_saved(job.step), *fmt.megatron_timer("save-checkpoint", spread, took_ms)])
        job.last_checkpoint = job.step
        for r in range(self.world):
            if self.modes[r] == CHECKPOINT:
                self._set_mode(r, NORMAL)
        self._resume()

    def _begin_eval(self) -> None:
        job, p = self.job, self.config.realism_params
        seconds = p.eval_iters * self.config.step_seconds * p.eval_step_share
        job.pause, job.pause_started, job.pause_until = EVAL_PAUSE, self.t, self.t + seconds
        self._note("evaluation", iteration=job.step, seconds=round(seconds, 2))

    def _end_eval(self) -> None:
        job = self.job
        x = job.step / 1000 + 1
        loss = 1.6 + 3.1 * x**-0.45 + job.loss_drift + self.rng.gauss(0, 0.01)  # a little above training loss
        self._train(self.slots[-1], fmt.megatron_validation(job.step, loss))
        self._resume()

    def _begin_restart(self, down: float) -> None:
        """The job is stopped (preempted, requeued): torchrun passes SIGTERM on, every rank exits."""
        job = self.job
        job.pause, job.pause_started, job.pause_until = RESTART_PAUSE, self.t, self.t + down
        for n in self.slots:
            ranks = self.ranks_on(n)
            lines = fmt.torchrun_death_signal(self._node_ts(n), self._launcher_pid(n), [self._pid(r) for r in ranks])
            self._train(n, lines)
            for r in ranks:
                self._set_mode(r, TERMINATED)
        self._note("restart", iteration=job.step, from_iteration=job.last_checkpoint, down_s=round(down, 2))

    def _end_restart(self) -> None:
        """Fresh processes load the last checkpoint; the steps since it are trained again."""
        job = self.job
        self.generation += 1
        self.control_version += 1
        for r in range(self.world):
            self.modes[r] = NORMAL
        job.step = job.last_checkpoint
        job.seq = job.step * 4 + 17
        self._train(self.slots[0], fmt.megatron_loading(job.step))
        for k, n in enumerate(self.slots[1:], start=1):
            self._train(n, [fmt.resuming(self._node_ts(n), k * self.gpn, job.step)])
        job.pause, job.pause_started = LOAD_PAUSE, self.t
        job.pause_until = self.t + self.config.realism_params.restart_load_s
        for fabric in self.fabrics:
            fabric.storage_read = CHECKPOINT_READ_BYTES_PER_S

    def _loader_stall(self, rank: int, seconds: float) -> None:
        """One rank's data loader is late: its GPU idles, everyone else waits in the all-reduce, then it recovers."""
        job = self.job
        self._set_mode(rank, CULPRIT_DATA)
        job.stall_rank = rank
        job.stall_until = max(job.stall_until, self.t + seconds)

    def _stop_pause(self) -> None:
        job = self.job
        if not job.pause:
            return
        job.pause = ""
        for fabric, host in zip(self.fabrics, self.hosts, strict=True):
            fabric.storage_write = fabric.storage_read = 0.0
            host.io_load = 0.0

    def _resume(self) -> None:
        """Back to training: the next step starts now (Megatron's iteration timer leaves the pause out)."""
        job = self.job
        self._stop_pause()
        job.phase, job.started_at = 0.0, self.t
        self._plan_step()

    def _learning_rate(self, step: int, cosine: float) -> float:
        """The schedule's rate; with realism, a linear warmup over the first iterations of the fresh job."""
        real = self.real
        if real is not None and step < real.params.warmup_iters:
            return 3e-4 * (step + 1) / real.params.warmup_iters
        return cosine

    def _spiked(self, loss: float, grad_norm: float) -> tuple[float, float]:
        """A loss spike in progress raises loss and grad norm, then fades over some steps."""
        job = self.job
        if not job.loss_spike or self.real is None:
            return loss, grad_norm
        spike = job.loss_spike
        job.loss_spike = spike * math.exp(-1.0 / self.real.params.loss_spike_steps)
        if job.loss_spike < 0.005:
            job.loss_spike = 0.0
        return loss * (1 + spike), grad_norm * (1 + 2 * spike)


def _first(every: float, share: float) -> float:
    """The first of a periodic event: `share` into its first interval (never, for an interval of 0)."""
    return every * share if every > 0 else math.inf


def _gap(rng: random.Random, mean: float) -> float:
    """Time to the next event of a Poisson process with this mean gap (never, for a mean of 0)."""
    return rng.expovariate(1.0 / mean) if mean > 0 else math.inf
