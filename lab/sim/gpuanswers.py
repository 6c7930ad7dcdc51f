"""The simulated machines' GPUs and NICs answering the agent's real check suite (agents/checks), which runs against
fake NVML and PyTorch (lab/sim/fakegpu) fed from each machine's state file (lab/sim/gpustate.py).

When a machine's fake library asks, the runner answers with the machine's state, computed from its faults with the
accelerated campaign's code (lab/sim/checks.py): per GPU the figures PyTorch would measure, whether it hangs,
corrupts or fell off the bus, its NVML fields as last sampled and the driver's recovery action; the node's NVLink
all-reduce bus bandwidth. Answering is also when the checks' traffic sets a flapping InfiniBand port off again (or
a congested node's ports drop packets): the error counters grow in the node's kernel tree, after the suite's first
read of them (agents/checks/network.py reads them before its first check and after its last).

Timing: a machine out for its checks (sent to `check` by a diagnose decision) has its state `done` `check_seconds`
after it went out, as the placeholder check took before; the agent's compute check waits for that. Any other
machine's checks (an idle spare's, a person's) are done at once. An answer lasts while the machine stays where it
is, ANSWER_TTL_S at most (longer than any suite): then, or when it moves (back to the pool, to repair), its state
goes and its next checks get a fresh one.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.checks.suite import Options
from lab.sim import gpustate
from lab.sim.checks import XID_RESET, SimCompute, nvlink_busbw, port_growth
from lab.sim.dcgm_fields import MODEL_NAME
from lab.sim.pool import CHECK

if TYPE_CHECKING:
    from lab.sim.model import Cluster

GPU_RESET = 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET: what the driver asks for while a GSP stays hung
# The compute check, the first to wait for `done`, must end within the agent's timeout for it, its child process's
# start and measurements included: a longer check time is cut to this much after the suite asked.
MAX_HOLD_S = Options().compute_timeout_s - 60.0
ANSWER_TTL_S = 900.0  # past every check's timeout together: the suite that asked is over


def machine_state(cluster: Cluster, machine: int, rng: random.Random) -> dict[str, Any]:
    """What the machine's GPUs answer now (lab/sim/fakegpu reads it)."""
    sim = SimCompute(cluster, machine, rng)
    gpus = []
    for g in cluster.gpus[machine]:
        works = not g.lost and g.index not in sim.hung
        gpus.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "bus": g.bus,
                "lost": g.lost,
                "hung": g.index in sim.hung,
                "corrupting": g.corrupting,
                "gemm_tflops": sim.gemm_tflops(g.index) if works else None,
                "memory_gbps": sim.memory_gbps(g.index) if works else None,
                "h2d_gbps": sim.h2d_gbps(g.index) if works else None,
                # The GSP still hung after Xid 119/120 since the last reset: the driver asks for a reset.
                "recovery_action": GPU_RESET if g.xid in XID_RESET and not g.lost else 0,
                "values": dict(g.values),
            }
        )
    alive = [g for g in cluster.gpus[machine] if not g.lost]
    return {"model": MODEL_NAME, "gpus": gpus, "allreduce_busbw_gbps": nvlink_busbw(alive, rng)}


def machine_inventory(cluster: Cluster, machine: int) -> dict[str, Any]:
    """What the machine's NVML answers without measuring (gpustate.INVENTORY_FILE): its GPUs, whether one fell off
    the bus, and, on an NVL72 rack's tray, each GPU's NVLink fabric info as the fabric manager has it now."""
    domain = cluster.nvl72
    gpus = []
    for g in cluster.gpus[machine]:
        fabric = None
        if domain is not None and machine < domain.trays:
            fabric = dataclasses.asdict(domain.fabric(machine, g.index))
        gpus.append({"index": g.index, "uuid": g.uuid, "bus": g.bus, "lost": g.lost, "fabric": fabric})
    return {"model": MODEL_NAME, "gpus": gpus}


class GpuAnswers:
    """Every simulated machine's answers to its agent's checks, kept up to date by `tick`."""

    def __init__(
        self,
        cluster: Cluster,
        folder: Path,
        *,
        check_seconds: float,
        sync_tree: Callable[[int], None],
        say: Callable[[str], None],
    ) -> None:
        self.cluster, self.folder, self.check_seconds = cluster, folder, check_seconds
        self.sync_tree, self.say = sync_tree, say
        self._place: dict[int, str] = {}
        self._out_since: dict[int, float] = {}  # machine -> when it went out for its checks
        self._pending: dict[int, tuple[float, dict[str, Any]]] = {}  # machine -> (when done, its state)
        self._answered: dict[int, float] = {}  # machine -> when its state was written
        self._inventories: dict[int, dict[str, Any]] = {}  # machine -> its inventory as last written
        self.write_inventories()  # before any agent starts: its NVML answers from it

    def path(self, name: str) -> Path:
        """The machine's state file (the runner gives its agent this path in gpustate.ENV)."""
        return self.folder / name / gpustate.STATE_FILE

    def write_inventories(self) -> None:
        """Every machine's inventory file, rewritten where it changed (a GPU lost, the NVLink fabric degraded)."""
        for m, name in enumerate(self.cluster.node_names):
            inventory = machine_inventory(self.cluster, m)
            folder = self.folder / name
            if inventory != self._inventories.get(m) and folder.is_dir():  # a machine with no folder runs no agent
                gpustate.write(folder / gpustate.INVENTORY_FILE, inventory)
                self._inventories[m] = inventory

    def tick(self, elapsed: float) -> None:
        cluster = self.cluster
        self.write_inventories()
        for m, name in enumerate(cluster.node_names):
            path = self.path(name)
            place = cluster.place[m]
            moved = place != self._place.get(m)
            if moved or elapsed - self._answered.get(m, elapsed) > ANSWER_TTL_S:  # its next checks: a fresh answer
                self._pending.pop(m, None)
                self._answered.pop(m, None)
                path.unlink(missing_ok=True)
            if moved:
                self._place[m] = place
                self._out_since.pop(m, None)
                if place == CHECK:
                    self._out_since[m] = elapsed
            asked = gpustate.asked_path(path)
            if asked.exists():
                asked.unlink(missing_ok=True)
                if not path.exists():
                    self._answer(m, name, elapsed)
            pending = self._pending.get(m)
            if pending is not None and elapsed >= pending[0]:
                del self._pending[m]
                self._done(m, name, pending[1])

    def _answer(self, m: int, name: str, elapsed: float) -> None:
        cluster = self.cluster
        rng = random.Random(f"{name}:{cluster.t}")
        state = machine_state(cluster, m, rng)
        self._answered[m] = elapsed
        ports = {p.device: p for p in cluster.fabrics[m].ports}
        for device, grew in port_growth(cluster, m, rng).items():
            for counter, count in grew.items():
                ports[device].counters[counter] += count
        self.sync_tree(m)  # the ports' counters on disk before any fake library goes on
        since = self._out_since.get(m)
        done_at = elapsed if since is None else min(since + self.check_seconds, elapsed + MAX_HOLD_S)
        if elapsed >= done_at:
            self._done(m, name, state)
            return
        self._pending[m] = (done_at, state)
        gpustate.write(self.path(name), {**state, "done": False})

    def _done(self, m: int, name: str, state: dict[str, Any]) -> None:
        gpustate.write(self.path(name), {**state, "done": True})
        what = "its checks ran" if m in self._out_since else "its GPUs answered a check outside a diagnosis"
        self.say(f"t={self.cluster.t:.1f}s {name}: {what} ({len(state['gpus'])} GPUs, from its faults)")
