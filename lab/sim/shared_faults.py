"""Faults of a component several machines share, mixed into the cluster (lab/sim/model.py) on top of FaultInjection
(lab/sim/faults.py): a leaf switch down, a bad driver rollout, a storage outage, a rack's power lost. The ground truth
blames the component, not the machines: its machines are to be cordoned from new work (one shared incident), none
evicted.

Where each machine sits (`topology`): POD_MACHINES machines per leaf switch, rack and power domain, named after the
cluster's node prefix; every machine mounts the job's dataset. A fault hits the component's machines that run the
job's ranks (a spare behind a dead switch has no job to fail); the repair (the switch replaced, the driver rolled
back, the mount back, the power restored) restores them and restarts the job.
"""

from __future__ import annotations

import zlib
from typing import Any

from lab.sim import logformat as fmt
from lab.sim.faults import FaultInjection, FaultRecord
from lab.sim.host import DRIVER_VERSION
from lab.sim.modes import CRASH_ECC, CRASH_NCCL, CRASH_USER, CULPRIT_SYNC
from lab.sim.network_faults import _hca, _ip
from lab.sim.scenarios import FaultSpec

POD_MACHINES = 4  # machines behind one leaf switch, in one rack, on one power domain
ROLLOUT_BRANCH = "570.86"  # the bad driver a rollout installs: this branch, a build per simulated cluster
ROLLOUT_LEAD_S = 60.0  # from the install (the agents report the version) to the GSP failing under load
MIN_MEMBERS = 3  # a component fault needs this many of its machines in the job to be told from single faults
_XID_119 = (
    "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20801348 0x404)."
)


def rollout_driver(node_prefix: str) -> str:
    """The driver a rollout installs on this cluster's machines. A build of its own per cluster, as its racks and
    switches are its own (`topology`): the campaign's jobs run in processes of their own over one service, and two
    jobs' rollouts meeting in the fleet's current labels would look like one rollout to twice the machines."""
    return f"{ROLLOUT_BRANCH}.{100 + zlib.crc32(node_prefix.encode()) % 900}"


def topology(node_prefix: str, machine: int) -> dict[str, Any]:
    """The machine's place and storage, as its operator labels it (the agent's node_labels and storage_mounts)."""
    pod = machine // POD_MACHINES
    base = node_prefix.rstrip("-") or "sim"
    return {
        "rack": f"{base}-rack-{pod}",
        "switch": f"{base}-leaf-{pod}",
        "power_domain": f"{base}-pdu-{pod}",
        "storage_mounts": [f"/mnt/datasets/{base}"],
    }


class SharedFaults(FaultInjection):
    """Cluster's shared-component faults (lab/sim/model.py mixes this in); the state is the cluster's."""

    def location(self, machine: int) -> dict[str, Any]:
        return topology(self.config.node_prefix, machine)

    def pod_in_job(self) -> list[int]:
        """The machines of the pod with the most machines in the job (the lowest pod on a tie)."""
        pods: dict[int, list[int]] = {}
        for m in sorted(self.slots):
            pods.setdefault(m // POD_MACHINES, []).append(m)
        return max(sorted(pods.items()), key=lambda kv: len(kv[1]))[1] if pods else []

    def component_fault_ready(self, kind: str) -> bool:
        """Whether a fault of this kind would hit enough of the job's machines to be a shared cause now."""
        if kind in ("switch_down", "rack_power_loss"):
            return len(self.pod_in_job()) >= MIN_MEMBERS
        return len(self.slots) >= MIN_MEMBERS

    def _component(self, record: FaultRecord, kind: str, component: str, machines: list[int]) -> None:
        record.nodes = [self.node_names[m] for m in machines]
        record.ranks = [r for m in machines for r in self.ranks_on(m)]
        record.details = {"component_kind": kind, "component": component, "machines": machines}

    def _inject_switch_down(self, spec: FaultSpec, record: FaultRecord) -> None:
        """The leaf switch fails: every port of its machines goes down at once; each rank's NCCL connections fail
        with IB error 12, the job dies."""
        machines = self.pod_in_job()
        self._component(record, "switch", self.location(machines[0])["switch"], machines)
        for n in machines:
            peer = next((m for m in self.slots if m not in machines), n)
            for gpu in range(self.gpn):
                nic, port = _hca(gpu)
                self._kern(n, f"mlx5_core {nic} {port}: Link down")
                self.fabrics[n].flap_down(gpu, self.rng)
            lines: list[str] = []
            for rank in self.ranks_on(n):
                pid, gpu = self._pid(rank), rank % self.gpn
                lines += fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Send")
                self._set_mode(rank, CRASH_NCCL)
            self._train(n, lines)
        self._hang_job({}, self.config.watchdog_seconds)
        self._schedule(1.0, self._teardown_all)

    def _inject_driver_rollout(self, spec: FaultSpec, record: FaultRecord) -> None:
        """A new driver reaches the job's machines (a share of the fleet): installed first, as a rollout does (the
        agents report the new version from then on), and ROLLOUT_LEAD_S later each of their GPUs' GSP stops answering
        under the job's load (the same Xid 119 everywhere): every rank blocks in its CUDA call, the job hangs. The
        fault's time is that onset, when there is something to find."""
        machines = sorted(self.slots)
        driver = rollout_driver(self.config.node_prefix)
        self._component(record, "driver", driver, machines)
        for n in machines:
            self.hosts[n].driver_version = driver
        self._later(ROLLOUT_LEAD_S, lambda: self._rollout_fails(record, machines, driver))

    def _rollout_fails(self, record: FaultRecord, machines: list[int], driver: str) -> None:
        hit = [n for n in machines if n in self.slots and self.hosts[n].driver_version == driver]
        if not hit:
            return  # rolled back, or its machines left the job, before the driver met the load
        record.t, record.injected_at = self.t, self._ts()
        stuck: dict[int, str] = {}
        for n in hit:
            for rank in self.ranks_on(n):
                g = self.gpus[n][rank % self.gpn]
                g.xid = 119
                self._kern(n, fmt.xid(g.bus, 119, _XID_119, pid=self._pid(rank), name="python"))
                stuck[rank] = CULPRIT_SYNC
        self.faults_version += 1
        self._hang_job(stuck, self.config.watchdog_seconds)

    def _inject_storage_outage(self, spec: FaultSpec, record: FaultRecord) -> None:
        """The dataset's file system stops answering: every rank's data loader fails its read with EIO, the job
        dies."""
        machines = sorted(self.slots)
        mount = self.location(machines[0])["storage_mounts"][0]
        self._component(record, "storage", mount, machines)
        for n in machines:
            lines: list[str] = []
            for rank in self.ranks_on(n):
                lines += fmt.traceback_storage(rank, f"{mount}/train/shard-{self.rng.randrange(100_000):05d}.bin")
                self._set_mode(rank, CRASH_USER)
            self._train(n, lines)
        self.job.state = "failed"
        self._schedule(1.0, self._teardown_all)

    def _inject_rack_power_loss(self, spec: FaultSpec, record: FaultRecord) -> None:
        """The rack's power feed drops: its machines lose their GPUs' power first (every GPU falls off the bus at
        once), then go dark; the job dies."""
        machines = self.pod_in_job()
        self._component(record, "power_domain", self.location(machines[0])["power_domain"], machines)
        for n in machines:
            for g in self.gpus[n]:
                g.lost, g.xid = True, 79
                self._kern(n, fmt.xid(g.bus, 79, "GPU has fallen off the bus."))
            for rank in self.ranks_on(n):
                self._set_mode(rank, CRASH_ECC)
        self._hang_job({}, self.config.watchdog_seconds)
        self._schedule(1.0, self._teardown_all)

    def _restore_component(self, record: FaultRecord) -> None:
        """The component repaired: its machines' ports, GPUs and driver as before the fault."""
        for n in (record.details or {}).get("machines", []):
            for g in self.gpus[n]:
                g.repair()
            self.hosts[n].repair()
            self.hosts[n].driver_version = DRIVER_VERSION
            self.fabrics[n].repair()
