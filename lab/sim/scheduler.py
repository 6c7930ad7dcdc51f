"""The simulated cluster's scheduler: the adapters' own poll-act-ack loop (agents/schedulers/loop.py) against the
real scheduler API, with the simulated cluster as its backend.

The loop runs in a thread (long poll with the scheduler token, act, ack `done` or `failed`); each action is
handed to the simulator's own loop, which owns the model, and done there with `act` (lab/sim/actions.py).
When the job's machines change, the new rank map is registered (POST /api/v1/jobs) as a launcher would, with
the parallelism and hang timeout the service already holds for the job.

Returns are reported as every adapter reports them (the loop's sweep: a node faultline holds out of service that
the simulated scheduler has back in its pool or its job, POST /api/v1/nodes/NAME/return), and before a rank map that
names a machine back from repair is registered: a scheduler that knows the node is back says so before it runs work
there, so faultline runs the node's gate rather than finding work on a quarantined node.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agents.schedulers.client import FaultlineClient
from agents.schedulers.loop import ActionFailed, AdapterLoop, LoopOptions
from lab.sim.actions import LOOP_KINDS, Outcome, act
from lab.sim.model import Cluster

log = logging.getLogger(__name__)
ACT_TIMEOUT_S = 30.0  # the simulator's loop acts within a tick; longer means it is stopping
RETURNS_EVERY_S = 5.0  # a repaired machine waits in the spare pool this long at most before faultline hears of it


class ClusterBackend:
    """An adapter backend whose every action is `act` on the cluster, done by the simulator's thread."""

    name = "simulated"

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.requests: queue.Queue[tuple[Mapping[str, Any], Future[Outcome]]] = queue.Queue()
        # Which machines the scheduler would place work on, as of the simulator's last tick (None before the first):
        # the loop's thread reads it without waiting for the simulator's.
        self._schedulable: dict[str, bool] | None = None

    def _act(self, decision: Mapping[str, Any]) -> str:
        done: Future[Outcome] = Future()
        self.requests.put((decision, done))
        try:
            outcome = done.result(timeout=ACT_TIMEOUT_S)
        except TimeoutError:
            raise ActionFailed("the simulated cluster did not act in time (stopping?)") from None
        if not outcome.done:
            raise ActionFailed(outcome.message)
        return outcome.message

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        return self._act(decision)

    def put_back(self, node: str, decision: Mapping[str, Any]) -> str:
        return self._act(decision)

    def reset_gpu(self, node: str, gpu: int, decision: Mapping[str, Any]) -> str:
        return self._act(decision)

    def preview_reset_gpu(self, node: str, gpu: int, decision: Mapping[str, Any]) -> str:
        return f"would reset GPU {gpu} of {node} and restart the job's ranks"

    def in_service(self, node: str) -> bool | None:
        schedulable = self._schedulable
        return None if schedulable is None else schedulable.get(node)

    def serve(self, cluster: Cluster) -> list[tuple[Mapping[str, Any], Outcome]]:
        """Act on what the loop asked since the last call (the simulator's thread, between two ticks)."""
        served = []
        while True:
            try:
                decision, done = self.requests.get_nowait()
            except queue.Empty:
                break
            outcome = act(cluster, decision)
            done.set_result(outcome)
            served.append((decision, outcome))
        self._schedulable = {name: cluster.schedulable(m) for m, name in enumerate(cluster.node_names)}
        return served


class ClusterLoop(AdapterLoop):
    """The adapters' loop, for this cluster's machines only: a decision about another node (another scheduler's,
    or one made by hand through the API) is left pending for whoever runs that node."""

    def __init__(self, *args: Any, nodes: set[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes = nodes

    def handle(self, decision: Mapping[str, Any]) -> None:
        if decision.get("node") not in self.nodes:
            self._finish(int(decision["id"]))  # remembered, not acknowledged
            return
        super().handle(decision)


class SchedulerStandIn:
    """The adapter loop in a thread, and the job's registrations in order, one at a time."""

    def __init__(self, url: str, token: str, *, job_id: str, nodes: list[str], say: Callable[[str], None]) -> None:
        self.job_id, self.say = job_id, say
        self.stop = threading.Event()
        self.client = FaultlineClient(url, token, stop=self.stop)
        self.backend = ClusterBackend(self.stop)
        options = LoopOptions(wait_s=20.0, kinds=LOOP_KINDS, returns_every_s=RETURNS_EVERY_S)
        self.loop = ClusterLoop(self.client, self.backend, options, stop=self.stop, nodes=set(nodes))
        self._thread = threading.Thread(target=self.loop.run, name="sim-scheduler", daemon=True)
        self._registrar = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-register")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=ACT_TIMEOUT_S + 5.0)
        self._registrar.shutdown(wait=True, cancel_futures=False)
        self.client.close()

    def register(self, rank_map: list[dict[str, Any]], world_size: int) -> None:
        """Register the job's new rank map, keeping what the service holds for it (parallelism, hang timeout)."""
        self._registrar.submit(self._register, rank_map, world_size)

    def _register(self, rank_map: list[dict[str, Any]], world_size: int) -> None:
        try:
            # A machine back from repair that takes a node rank: report it back first, as the scheduler knows it is.
            returned = self.loop.sweep_returns(only={r["node"] for r in rank_map})
            if returned:
                self.say(f"scheduler: reported {', '.join(returned)} back in service")
            current = self.client.job(self.job_id) or {}
            body: dict[str, Any] = {"job_id": self.job_id, "world_size": world_size, "ranks": rank_map}
            for key in ("parallelism", "hang_timeout_s"):
                if current.get(key) is not None:
                    body[key] = current[key]
            self.client.register_job(body)
            nodes = sorted({r["node"] for r in rank_map})
            self.say(f"scheduler: registered job {self.job_id} on {', '.join(nodes)}")
        except Exception as exc:  # the demo goes on; the agents' data still names the job
            log.warning("registering job %s failed: %s", self.job_id, exc)
            self.say(f"scheduler: registering job {self.job_id} failed: {exc}")
