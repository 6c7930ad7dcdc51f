"""What a scheduler does with one faultline decision, done to the simulated cluster: the closed loop's core,
without any transport.

`act(cluster, decision)` takes a decision as the scheduler API lists it (a mapping with `kind`, `node` and,
for reset_gpu, `gpu`) and returns the `Outcome` to acknowledge. The demo's scheduler stand-in
(lab/sim/scheduler.py) calls it between a long poll and an ack over HTTP; an accelerated-time harness calls it
directly with the service's decision rows. Whenever `cluster.slots_version` changes (at once after a swap
with a spare free; later when the job waited for one) the job runs on other machines: register
`cluster.rank_map()` as a launcher would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab.sim.model import Cluster
from lab.sim.pool import CHECK, REPAIR

# What the stand-in polls for: the node kinds every adapter acts on, and diagnose (take the node out for a check).
LOOP_KINDS = ("evict", "cordon", "return", "reset_gpu", "diagnose")


@dataclass(frozen=True)
class Outcome:
    done: bool  # acknowledge `done` (else `failed`, with the message)
    message: str
    rank_map_changed: bool = False  # the job's machines changed: register its new rank map

    @property
    def ack(self) -> str:
        return "done" if self.done else "failed"


def act(cluster: Cluster, decision: Mapping[str, Any]) -> Outcome:
    """Do what the decision asks to the cluster (idempotent: a repeated decision changes nothing more)."""
    kind = str(decision.get("kind", ""))
    if kind not in LOOP_KINDS:
        return Outcome(False, f"the simulated scheduler does not act on {kind or 'a decision without a kind'}")
    name = decision.get("node")
    if not name:
        return Outcome(False, f"{kind} decision names no node")
    machine = cluster.machine_index(str(name))
    if machine is None:
        return Outcome(False, f"no node {name} in the simulated cluster")
    before = cluster.slots_version
    if kind == "reset_gpu":
        gpu = decision.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < cluster.gpn:
            return Outcome(False, f"reset_gpu decision names no GPU of {name} (0-{cluster.gpn - 1})")
        message = cluster.reset_gpu(machine, gpu)
        if cluster.place[machine] == CHECK:  # the checks named this GPU: reset, the machine is fit again
            message += "; " + cluster.checked(machine)
    elif kind == "evict":
        message = cluster.swap_out(machine, then=REPAIR)
    elif kind == "diagnose":
        message = cluster.swap_out(machine, then=CHECK)
    elif kind == "cordon":
        message = cluster.cordon(machine)
    else:  # return
        if cluster.place[machine] == REPAIR:
            return Outcome(False, f"{name} is still {cluster.place[machine]}: it rejoins the spare pool when done")
        # Out for a check: the service returns it when its checks pass (service/checks/loop.py).
        message = cluster.checked(machine) if cluster.place[machine] == CHECK else cluster.put_back(machine)
    return Outcome(True, message, rank_map_changed=cluster.slots_version != before)
