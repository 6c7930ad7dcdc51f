"""The closed loop's side of the simulated cluster: the spare pool, swapping a node out of the job and a spare in,
GPU resets, the repair shop, and planned maintenance (a fault kind whose injection is a drain).

A machine is in one place at a time: the job (a node rank in `slots`), the spare pool, the repair shop, a
check (after `diagnose`), or cordoned. Taking a machine out of the job stops every rank (torchrun's elastic
rendezvous restarts them all), and `restart_seconds` later the job resumes from its last checkpoint with fresh
processes (a new generation) on the new set of machines. With no spare free, the job waits for one: the first
machine back from repair fills the empty node rank.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lab.sim import logformat as fmt
from lab.sim.faults import FaultInjection, FaultRecord
from lab.sim.job import RESTART_PAUSE
from lab.sim.modes import DEAD, TERMINATED
from lab.sim.realism import RealState
from lab.sim.scenarios import FaultSpec

IN_JOB, SPARE, REPAIR, CHECK, CORDONED = "job", "spare", "repair", "check", "cordoned"
# Fault kinds a GPU reset clears: a hung GSP, and a row remap that waits for the reset to be applied.
RESET_CLEARS = frozenset({"gpu_reset", "row_remap_pending", "ecc_dbe", "sram_ecc", "gsp_error"})


@dataclass(frozen=True)
class LoopEvent:
    """One thing the closed loop did to a machine, for the ground truth and the demo's summary."""

    t: float
    at: datetime
    kind: str  # swap_out | swap_in | reset_gpu | to_repair | to_check | to_pool | cordon | uncordon | restart
    node: str  # the machine, or the job's id for a restart
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {"t": round(self.t, 1), "at": self.at.isoformat(), "kind": self.kind, "node": self.node}
        if self.detail:
            out["detail"] = self.detail
        return out


def check_machine(cluster: SparePool, machine: int) -> bool:
    """The placeholder check (without `service_checks`), and a person's look at a check nobody answered: healthy
    when the machine carries no fault. With `service_checks` the service decides from the results the machine
    ships (its agent's own suite on the simulated GPUs: lab/sim/gpuanswers.py)."""
    return not cluster.faults_on(machine)


class SparePool(FaultInjection):
    """Cluster's closed loop (lab/sim/model.py mixes this in), on top of its faults; the state below, beside
    FaultInjection's, is the cluster's."""

    machines: int
    _slot_of: dict[int, int]
    _event_seq: int
    _events: list[tuple[float, int, int, Callable[[], None]]]
    real: RealState | None
    step_history: list[tuple[int, float, float]]

    if TYPE_CHECKING:

        def _ts(self, offset: float = 0.0) -> datetime: ...
        def _kern(self, node: int, *messages: str) -> None: ...
        def _train(self, node: int, lines: list[str]) -> None: ...
        def _pid(self, rank: int) -> int: ...
        def _launcher_pid(self, node: int) -> int: ...
        def _set_mode(self, rank: int, mode: str) -> None: ...

    def _init_pool(self) -> None:
        self.place: dict[int, str] = {m: IN_JOB for m in self.slots}
        self.pool: list[int] = [m for m in range(self.machines) if m not in self._slot_of]  # first free, first used
        self.place.update({m: SPARE for m in self.pool})
        self.vacant: list[int] = []  # node ranks waiting for a spare
        self.slots_version = 0  # bumped whenever the job's machines change
        self.restarts = 0  # job restarts the loop caused
        self.loop_events: list[LoopEvent] = []
        self._restart_at: float | None = None
        self._check_round: dict[int, int] = {}  # machine -> its current check; a later one voids older timers
        # Cordoned while in the job: it keeps its ranks until it leaves, but the scheduler places nothing new there.
        self.cordoned: set[int] = set()

    # --- reading ---

    def machine_index(self, name: str) -> int | None:
        try:
            return self.node_names.index(name)
        except ValueError:
            return None

    def faults_on(self, machine: int) -> list[FaultRecord]:
        """The machine's faults not yet repaired."""
        return [f for f in self.faults if f.machine == machine and f.repaired_at is None]

    def spares_free(self) -> list[str]:
        return [self.node_names[m] for m in self.pool]

    def schedulable(self, machine: int) -> bool:
        """Whether the scheduler would place work there now: in the job or the spare pool, and not cordoned (what an
        adapter reads from the scheduler to report a node back in service)."""
        return self.place[machine] in (IN_JOB, SPARE) and machine not in self.cordoned

    def places(self) -> dict[str, dict[str, Any]]:
        """Each machine's place now, whether it runs the job's ranks, and since when (simulated seconds, and the time):
        the ground truth a node's state in the service is compared with."""
        last: dict[str, LoopEvent] = {event.node: event for event in self.loop_events}  # the latest per machine
        return {
            name: {
                "place": self.place[m],
                "ranks": m in self._slot_of,
                "cordoned": m in self.cordoned,
                "since": round(last[name].t, 1) if name in last else 0.0,
                "since_at": last[name].at.isoformat() if name in last else self._ts(-self.t).isoformat(),
            }
            for m, name in enumerate(self.node_names)
        }

    # --- what a scheduler does ---

    def swap_out(self, machine: int, *, then: str) -> str:
        """Take a machine out of the job (or out of the pool) and send it to `then` (REPAIR, CHECK or CORDONED);
        a spare takes its node rank and the job restarts. Idempotent: a machine already out stays where it is."""
        name = self.node_names[machine]
        where = self.place[machine]
        if where == CHECK and then == REPAIR:  # the service's verdict on the checks: evict
            for f in self.faults_on(machine):
                f.resolved_by = f.resolved_by or "diagnose"
            self._send(machine, REPAIR)
            return f"{name} failed its checks: to repair"
        if where in (REPAIR, CHECK):
            return f"{name} is already out of service ({where})"
        slot = self._slot_of.get(machine)
        if slot is None:  # a spare or a cordoned machine: no job to touch
            if machine in self.pool:
                self.pool.remove(machine)
            self._send(machine, then)
            return f"{name} taken out of the spare pool ({then})"
        self._stop_job(f"{name} left the job")
        del self._slot_of[machine]
        # The job's processes there end with its part of the job, a runaway data-loader worker (software_slow) among
        # them: a machine that passes its check and joins a job again later must not still wait for its input.
        self.loader_wait.pop(machine, None)
        self.hosts[machine].stop_cpu_hog()
        for f in self.faults_on(machine):
            if f.left_job_at is None:
                f.left_job_at = self._ts()
                f.resolved_by = f.resolved_by or ("evict" if then == REPAIR else "diagnose")
        self.faults_version += 1
        self._loop_note("swap_out", machine, f"node rank {slot}, to {then}")
        self._send(machine, then)
        self.vacant.append(slot)
        self._fill_vacancies()
        # What happens now, in order: a job missing a node rank cannot restart, so with no spare free it stays
        # stopped until one is (the rank map then changes, and the restart follows).
        checkpoint = f"its checkpoint at step {self.job.last_checkpoint}"
        if slot in self.vacant:
            return (
                f"{name} out of the job ({then}); node rank {slot} is waiting for a spare: no spare is free, so the "
                f"job stays stopped until one is, then restarts from {checkpoint}"
            )
        spare = self.node_names[self.slots[slot]]
        return (
            f"{name} out of the job ({then}); {spare} swapped in as node rank {slot}; the job restarts from "
            + checkpoint
        )

    def reset_gpu(self, machine: int, gpu: int) -> str:
        """Reset one GPU: what a reset clears is cleared; the job's ranks restart if the machine is in the job."""
        name = self.node_names[machine]
        g = self.gpus[machine][gpu]
        g.reset()
        now = self._ts()
        for f in self.faults_on(machine):
            if f.kind in RESET_CLEARS and gpu in f.gpus.get(name, []):
                f.repaired_at, f.resolved_by = now, "reset_gpu"
        self.faults_version += 1
        self._kern(machine, f"NVRM: GPU at {fmt.xid_bus(g.bus)}: GPU reset performed")
        self._loop_note("reset_gpu", machine, f"gpu {gpu}")
        if machine in self._slot_of:
            self._stop_job(f"GPU {gpu} of {name} reset")
            self._restart_when_ready()
            return f"GPU {gpu} of {name} reset; the job's ranks restart from its last checkpoint"
        return f"GPU {gpu} of {name} reset"

    def checked(self, machine: int) -> str:
        """The service's verdict on the checks: pass, the machine rejoins the spare pool."""
        name = self.node_names[machine]
        if self.place[machine] != CHECK:
            return f"{name} is {self._where(machine)}; no check to end"
        self._to_pool(machine)
        return f"{name} passed its checks: back in the spare pool"

    def cordon(self, machine: int) -> str:
        """No new work on the machine: a spare leaves the pool; a machine in the job stays there until it leaves."""
        name = self.node_names[machine]
        if machine in self.pool:
            self.pool.remove(machine)
            self.place[machine] = CORDONED
            self._loop_note("cordon", machine)
            return f"{name} cordoned (out of the spare pool)"
        if self.place[machine] == IN_JOB and machine not in self.cordoned:
            self.cordoned.add(machine)
            self._loop_note("cordon", machine, "keeps its ranks until it leaves the job")
        return f"{name} cordoned ({self.place[machine]})"

    def put_back(self, machine: int) -> str:
        """A cordoned machine back to the spare pool; one in repair or in a check is refused by the caller."""
        name = self.node_names[machine]
        if self.place[machine] == CORDONED:
            self._to_pool(machine)
            return f"{name} back in the spare pool"
        if machine in self.cordoned:
            self.cordoned.discard(machine)
            self._loop_note("uncordon", machine)
            return f"{name} uncordoned ({self._where(machine)})"
        return f"{name} is {self._where(machine)}; nothing to return"

    # --- the pool's own fault ---

    def _inject_host_maintenance(self, spec: FaultSpec, record: FaultRecord) -> None:
        """Planned host maintenance: the operator drains the machine (a silence first, where a harness has a
        service), so the scheduler takes it out of the job and a spare takes its place, as for an eviction;
        nothing is wrong with it and nobody may accuse it."""
        assert spec.node is not None
        self.swap_out(spec.node, then=REPAIR)

    # --- machine moves ---

    def _send(self, machine: int, then: str) -> None:
        self.place[machine] = then
        if then == REPAIR:
            self._loop_note("to_repair", machine, f"{self.config.repair_seconds:.0f} s")
            self._later(self.config.repair_seconds, lambda: self._repaired(machine))
        elif then == CHECK:
            round_ = self._check_round[machine] = self._check_round.get(machine, 0) + 1
            if self.config.service_checks:  # the service's verdict ends it; a person, if none comes
                self._loop_note("to_check", machine, "waiting for the service's verdict on its checks")
                self._later(self.config.check_wait_seconds, lambda: self._checked(machine, round_))
            else:
                self._loop_note("to_check", machine, f"{self.config.check_seconds:.0f} s")
                self._later(self.config.check_seconds, lambda: self._checked(machine, round_))
        else:
            self._loop_note("cordon", machine)

    def _checked(self, machine: int, round_: int) -> None:
        if self.place[machine] != CHECK or self._check_round.get(machine) != round_:
            return  # settled already (the service's verdict), or a later check runs
        if check_machine(self, machine):
            self._to_pool(machine)
        else:
            self._send(machine, REPAIR)

    def _repaired(self, machine: int) -> None:
        """Fixed in the shop: faults cleared, the driver reloaded; back to the spare pool."""
        for g in self.gpus[machine]:
            g.repair()
        self.hosts[machine].repair()
        self.hosts[machine].reboot()  # the shop reimages and reboots it: a return gate must not read old pressure
        self.fabrics[machine].repair()  # its loader wait ended when it left the job (swap_out)
        now = self._ts()
        for f in self.faults_on(machine):
            f.repaired_at = now
        self.faults_version += 1
        self._kern(machine, fmt.DRIVER_BANNER)
        self._to_pool(machine)

    def _to_pool(self, machine: int) -> None:
        self.cordoned.discard(machine)  # repaired, or checked: the scheduler offers it again
        self.place[machine] = SPARE
        self.pool.append(machine)
        self._loop_note("to_pool", machine)
        self._fill_vacancies()

    def _fill_vacancies(self) -> None:
        while self.vacant and self.pool:
            slot, machine = self.vacant.pop(0), self.pool.pop(0)
            self.slots[slot] = machine
            self._slot_of[machine] = slot
            self.place[machine] = IN_JOB
            self.slots_version += 1
            self.control_version += 1
            self._loop_note("swap_in", machine, f"node rank {slot}")
        if not self.vacant and self.job.pause == RESTART_PAUSE:
            self._restart_when_ready()

    def _where(self, machine: int) -> str:
        return {IN_JOB: "in the job", SPARE: "a spare", REPAIR: "in repair", CHECK: "in a check"}.get(
            self.place[machine], self.place[machine]
        )

    # --- the job ---

    def _stop_job(self, why: str) -> None:
        """torchrun on every node stops its ranks; the job waits (paused) until `_restart_when_ready`."""
        job = self.job
        self._epoch += 1  # the faulty timeline's pending events (watchdog, teardown, repeats) are void now
        if job.state == "running" and job.pause != RESTART_PAUSE:
            for n in list(self.slots):
                live = [r for r in self.ranks_on(n) if self.modes[r] not in DEAD]
                if live:
                    pids = [self._pid(r) for r in live]
                    self._train(n, fmt.torchrun_death_signal(self._node_ts(n), self._launcher_pid(n), pids))
        for r in range(self.world):
            self._set_mode(r, TERMINATED)
        self._stop_pause()
        if self.real is None:  # no checkpoint lines without realism: the job saved on the realism's interval
            job.last_checkpoint = self._checkpointed_step()
        job.comm_factor, job.stall_until, job.nan = 1.0, 0.0, False
        job.stuck_rank = job.stall_rank = None
        job.state = "running"
        job.pause, job.pause_started = RESTART_PAUSE, self.t
        job.pause_until = float("inf")  # until _restart_when_ready sets it
        self._failed_order.clear()
        self._torn_down.clear()
        self.restarts += 1
        self._loop_note("restart", None, why)

    def _checkpointed_step(self) -> int:
        """The last step finished by the latest whole checkpoint interval (the job's start when none yet)."""
        every = self.config.realism_params.checkpoint_every_s
        saved_by = (self.t // every) * every
        done = [step for step, end, _ in self.step_history if end <= saved_by]
        return max([self.job.last_checkpoint, *done[-1:]])

    def _restart_when_ready(self) -> None:
        self.job.pause_until = self.t + self.config.restart_seconds

    # --- helpers ---

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        """An event no repair of the job's timeline cancels (epoch -1): machines come back whatever the job does."""
        self._event_seq += 1
        heapq.heappush(self._events, (self.t + delay, self._event_seq, -1, action))

    def _loop_note(self, kind: str, machine: int | None, detail: str = "") -> None:
        """One loop event on a machine (None: the job as a whole)."""
        node = self.node_names[machine] if machine is not None else str(self.config.job_id)
        self.loop_events.append(LoopEvent(self.t, self._ts(), kind, node, detail))
        self.faults_version += 1  # the runner rewrites the ground truth on this
