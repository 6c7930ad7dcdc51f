"""The faults of the simulated network, mixed into the cluster (lab/sim/model.py) on top of FaultInjection
(lab/sim/faults.py): a NIC down, an InfiniBand link that flaps, a port flapping within a minute, congestion; each
with its kernel lines and NCCL's."""

from __future__ import annotations

from lab.sim import dcgm_fields as F
from lab.sim import logformat as fmt
from lab.sim.faults import FaultInjection, FaultRecord, comm_factor_for
from lab.sim.modes import CRASH_NCCL
from lab.sim.scenarios import FaultSpec

IB_FLAP_STALL = 6.0  # seconds the first flap stalls the job
IB_SECOND_FLAP = 40.0  # the link drops again this long after the first flap, for good
IB_SECOND_FLAP_DOWN = 8.0
PORT_FLAPS = 3  # ib_port_flap: flaps within about a minute
PORT_FLAP_GAP = 23.0  # seconds between flaps (give or take a few)
PORT_ACTIVATION = 1.0  # seconds from link trained (INIT) to ACTIVE: the subnet manager's sweep
IB_CONGESTION_COMM_FACTOR = comm_factor_for(1.30)


class NetworkFaults(FaultInjection):
    """Cluster's network faults (lab/sim/model.py mixes this in); the state is the cluster's, as FaultInjection's."""

    def _inject_nic_down(self, spec: FaultSpec, record: FaultRecord) -> None:
        """NIC: the HCA of one GPU hits a firmware fatal error and its port stays down; the rank's NCCL
        connections fail (IB error 12), it dies, peers time out."""
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        nic, port = _hca(gpu)
        peer = self._peer(n)
        line, worker = 330 + self.rng.randrange(20), 900 + self.rng.randrange(99)
        self._kern(n, f"mlx5_core {nic}: poll_health:{800 + self.rng.randrange(60)}:(pid 0): Fatal error 1 detected")
        self._kern(n, f"mlx5_core {nic}: mlx5_health_try_recover:{line}:(pid {worker}): handling bad device here")
        self._kern(n, f"mlx5_core {nic} {port}: Link down")
        self._port_down(n, gpu)
        pid = self._pid(rank)
        lines = fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Send")
        self._train(n, lines + fmt.traceback_nccl_remote(rank, self.node_names[peer]))
        self._set_mode(rank, CRASH_NCCL)
        self._hang_job({}, self.config.watchdog_seconds)
        self._schedule(1.0, lambda: self._teardown_node(n))

    def _inject_ib_flap(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        nic, port = _hca(gpu)
        peer = self._peer(n)

        def link(state: str) -> None:
            self._kern(n, f"mlx5_core {nic} {port}: Link {state}")

        def nccl_errors() -> None:
            pid = self._pid(rank)
            lines = fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Recv")
            lines += fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Send")
            self._train(n, lines)

        def down() -> None:
            link("down")
            self._port_down(n, gpu)

        def up() -> None:
            link("up")
            self._port_up(n, gpu)

        # First flap: errors, the job stalls a few seconds, the link comes back.
        down()
        nccl_errors()
        self.job.stall_until = self.t + IB_FLAP_STALL
        self._schedule(IB_FLAP_STALL, up)

        def second_flap() -> None:
            down()
            nccl_errors()
            self._train(n, fmt.traceback_nccl_remote(rank, self.node_names[peer]))
            self._set_mode(rank, CRASH_NCCL)
            self._hang_job({}, self.config.watchdog_seconds)
            self._schedule(1.0, lambda: self._teardown_node(n))
            self._schedule(IB_SECOND_FLAP_DOWN, up)

        self._schedule(IB_SECOND_FLAP, second_flap)

    def _peer(self, n: int) -> int:
        """The machine of the next node rank (the ring neighbour NCCL's IB lines name)."""
        slot = self.node_rank(n) or 0
        return self.slots[(slot + 1) % len(self.slots)] if len(self.slots) > 1 else n

    def _port_down(self, n: int, gpu: int) -> None:
        """The GPU's IB port loses its link (counters step, state DOWN, the PHY polling)."""
        self.fabrics[n].flap_down(gpu, self.rng)

    def _port_up(self, n: int, gpu: int) -> None:
        """The link trains again (INIT), then the subnet manager activates the port."""
        self.fabrics[n].link_trained(gpu)
        self._schedule(PORT_ACTIVATION, lambda: self.fabrics[n].port_active(gpu))

    def _port_flaps(self, spec: FaultSpec, nccl: bool) -> None:
        """PORT_FLAPS flaps of the GPU's port within about a minute; NCCL retries through each and the job goes on
        (it stalls while the link is down). With `nccl`, each flap also leaves NCCL's IB error lines."""
        n, gpu = spec.node, spec.gpu
        assert n is not None and gpu is not None
        rank = self._rank(n, gpu)
        peer = self._peer(n)

        def flap() -> None:
            down_s = 3.0 + 2.0 * self.rng.random()
            self._port_down(n, gpu)
            self.job.stall_until = max(self.job.stall_until, self.t + down_s + PORT_ACTIVATION + 0.5)
            self._schedule(down_s, lambda: self._port_up(n, gpu))
            if nccl:
                pid = self._pid(rank)
                self._train(n, fmt.nccl_ib_error(self.node_names[n], pid, pid + 83, gpu, _ip(peer), _ip(n), "Recv"))

        flap()
        at = 0.0
        for _ in range(PORT_FLAPS - 1):
            at += PORT_FLAP_GAP + self.rng.uniform(-4.0, 4.0)
            self._schedule(at, flap)

    def _inject_ib_port_flap(self, spec: FaultSpec, record: FaultRecord) -> None:
        self._port_flaps(spec, nccl=False)

    def _inject_ib_port_flap_nccl(self, spec: FaultSpec, record: FaultRecord) -> None:
        self._port_flaps(spec, nccl=True)

    def _inject_ib_congestion(self, spec: FaultSpec, record: FaultRecord) -> None:
        assert spec.node is not None
        self.fabrics[spec.node].congest(80.0 + 50.0 * self.rng.random())
        self.job.comm_factor = IB_CONGESTION_COMM_FACTOR
        self._plan_step()


def _hca(gpu: int) -> tuple[str, str]:
    """The PCI address and port name of the GPU's own HCA (one NIC per GPU, on the bus before it)."""
    bus = F.PCI_BUSES[gpu % 8] - 1
    return f"0000:{bus:02x}:00.0", f"ibp{bus}s0"


def _ip(node: int) -> str:
    return f"10.10.{node // 200}.{node % 200 + 11}"
