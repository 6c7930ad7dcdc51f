"""One simulated node's network: eight InfiniBand ports (one ConnectX-7 per GPU, as on a DGX H100) and one
Ethernet (RoCE) NIC for storage, with the counters the kernel exposes for them.

Counters integrate traffic: an IB port carries its GPU's share of the job's all-reduce, so its data counters
grow in step with the training's communication phases. Fault flags (a port that is down, a congested node)
bend the numbers; the faults decide when they are set. Rendering into kernel files is lab/sim/kerneltree.py.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from lab.sim import dcgm_fields as F

IB_PORTS = 8
IB_RATE = "400 Gb/sec (4X NDR)"
ROCE_DEVICE = "mlx5_8"
ROCE_NETDEV = "enp170s0f0np0"
ROCE_RATE = "200 Gb/sec (4X HDR)"
ROCE_SPEED_MBPS = 200000
# Bytes per second one 400 Gb/s port carries while its GPU all-reduces (about 92% of line rate).
IB_PEAK_BYTES = 46e9
IB_MTU = 4096
# port_xmit_wait ticks per second at full communication on a healthy fabric (credits briefly exhausted),
# and how much worse it is on a congested node's ports.
XMIT_WAIT_PER_S = 3.0e4
CONGESTED_WAIT_FACTOR = 100.0
# Congestion notification packets per second at full communication: next to none on a healthy fabric,
# thousands under congestion (the switch marks ECN, the receiver answers with CNPs, the sender throttles).
CNP_PER_S = 0.05
CONGESTED_CNP_PER_S = 9000.0
# PFC pause frames per second the storage NIC sends (tx) and receives (rx) while its node is congested.
CONGESTED_PAUSE_TX_PER_S = 30000.0
CONGESTED_PAUSE_RX_PER_S = 8000.0
# Storage traffic: dataset reads and checkpoint writes on the Ethernet NIC.
STORAGE_RX_BYTES = 220e6
STORAGE_TX_BYTES = 25e6

# IB port states (Documentation/ABI/stable/sysfs-class-infiniband) and physical states.
DOWN, INIT, ARMED, ACTIVE = 1, 2, 3, 4
STATE_NAMES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
POLLING, DISABLED, LINK_UP, LINK_ERROR_RECOVERY = 2, 3, 5, 6
PHYS_STATE_NAMES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}

# Everything under ports/<n>/counters/ (drivers/infiniband/core/sysfs.c: the PMA PortCounters set, with the
# data and packet counters from the 64-bit extended set; the optional unicast/multicast ones left out).
PORT_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors",
    "port_rcv_packets", "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait",
    "symbol_error",
)  # fmt: skip
# A ConnectX-7's ports/<n>/hw_counters/ (drivers/infiniband/hw/mlx5/counters.c), congestion counters included.
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
    "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
    "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err",
    "rp_cnp_handled", "rp_cnp_ignored", "rx_atomic_requests", "rx_read_requests", "rx_write_requests",
)  # fmt: skip
# /sys/class/net/<netdev>/statistics/ (include/uapi/linux/if_link.h struct rtnl_link_stats64).
NET_STATISTICS = (
    "collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped", "rx_errors",
    "rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors", "rx_nohandler", "rx_over_errors",
    "rx_packets", "tx_aborted_errors", "tx_bytes", "tx_carrier_errors", "tx_compressed", "tx_dropped", "tx_errors",
    "tx_fifo_errors", "tx_heartbeat_errors", "tx_packets", "tx_window_errors",
)  # fmt: skip
# What `ethtool -S` prints for an mlx5 netdev with PFC on priority 3 (the RoCE traffic class), in its order.
ETHTOOL_STATS = (
    "rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "rx_vport_rdma_unicast_packets",
    "rx_vport_rdma_unicast_bytes", "tx_vport_rdma_unicast_packets", "tx_vport_rdma_unicast_bytes",
    "rx_out_of_buffer", "rx_discards_phy", "rx_crc_errors_phy", "rx_pause_ctrl_phy", "tx_pause_ctrl_phy",
    "rx_prio3_pause", "rx_prio3_pause_duration", "tx_prio3_pause", "tx_prio3_pause_duration",
    "rx_prio3_pause_transition", "link_down_events_phy",
)  # fmt: skip


@dataclass
class Port:
    """One RDMA port (port 1 of an mlx5 device): link state, PMA counters, mlx5 hw counters."""

    device: str
    link_layer: str  # "InfiniBand" or "Ethernet"
    rate: str
    gpu: int | None  # the GPU whose traffic it carries (InfiniBand); None for the storage NIC
    guid: int
    lid: int
    state: int = ACTIVE
    phys_state: int = LINK_UP
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PORT_COUNTERS, 0))
    hw: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HW_COUNTERS, 0))
    wait_scale: float = 1.0  # stable per-port difference (cable, switch port) peers comparison must tolerate
    congested: float = 0.0  # 0 healthy; >1 the factor its xmit_wait grows faster than its peers'

    @property
    def up(self) -> bool:
        return self.state == ACTIVE

    def add_traffic(self, xmit_bytes: float, rcv_bytes: float) -> None:
        c = self.counters
        # The PMA data counters count 4-byte words (IBA PortXmitData), packets follow the MTU.
        c["port_xmit_data"] += int(xmit_bytes / 4)
        c["port_rcv_data"] += int(rcv_bytes / 4)
        tx, rx = int(xmit_bytes / IB_MTU), int(rcv_bytes / IB_MTU)
        c["port_xmit_packets"] += tx
        c["port_rcv_packets"] += rx


@dataclass
class EthNic:
    """The storage NIC's netdev: kernel statistics and the `ethtool -S` counters (pause frames among them)."""

    netdev: str
    mac: str
    statistics: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NET_STATISTICS, 0))
    ethtool: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ETHTOOL_STATS, 0))
    pausing: bool = False  # the node is congested: PFC pause frames both ways


class Fabric:
    """A node's RDMA ports and storage NIC; `step` advances their counters by `dt` seconds of traffic."""

    def __init__(self, node: int, rng: random.Random) -> None:
        self.node = node
        self.ports = [
            Port(f"mlx5_{i}", "InfiniBand", IB_RATE, i, _guid(node, i, rng), lid=1 + node * 16 + i)
            for i in range(IB_PORTS)
        ]
        self.roce = Port(ROCE_DEVICE, "Ethernet", ROCE_RATE, None, _guid(node, IB_PORTS, rng), lid=0)
        for p in self.ports:
            p.wait_scale = math.exp(rng.gauss(0, 0.25))
            # A long-running host: traffic since the last counter reset, and the odd old link event.
            p.counters["port_xmit_data"] = rng.randrange(10**13, 10**14)
            p.counters["port_rcv_data"] = p.counters["port_xmit_data"] + rng.randrange(-(10**11), 10**11)
            for name in ("port_xmit_packets", "port_rcv_packets"):
                p.counters[name] = p.counters["port_xmit_data"] * 4 // IB_MTU
            # PortXmitWait is a 32-bit PMA counter that sticks at its maximum: far enough below it for any run.
            p.counters["port_xmit_wait"] = rng.randrange(10**6, 15 * 10**8)
            p.counters["symbol_error"] = rng.choice((0, 0, 0, 0, 0, 0, 2, 7))
            p.counters["link_downed"] = rng.choice((0, 0, 0, 0, 0, 1))
            p.counters["link_error_recovery"] = p.counters["link_downed"] + rng.choice((0, 0, 0, 1))
            p.hw["lifespan"] = 10  # the counters' cache lifetime in ms, a setting rather than a count
            p.hw["np_cnp_sent"] = rng.randrange(10**3, 10**5)
            p.hw["rp_cnp_handled"] = rng.randrange(10**3, 10**5)
            p.hw["rx_write_requests"] = rng.randrange(10**9, 10**10)
            p.hw["rx_read_requests"] = rng.randrange(10**6, 10**7)
        self.roce.hw["lifespan"] = 10
        self.nic = EthNic(ROCE_NETDEV, _mac(node, rng))
        stats = self.nic.statistics
        stats["rx_bytes"], stats["tx_bytes"] = rng.randrange(10**13, 10**14), rng.randrange(10**12, 10**13)
        stats["rx_packets"], stats["tx_packets"] = stats["rx_bytes"] // 8000, stats["tx_bytes"] // 8000
        stats["multicast"] = rng.randrange(10**4, 10**6)
        stats["rx_dropped"] = rng.choice((0, 0, 3, 17))
        e = self.nic.ethtool
        for name in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets"):
            e[name] = stats[name]
            e[f"{name[:2]}_vport_rdma_unicast_{name[3:]}"] = stats[name] * 9 // 10
        # Global pause is off where PFC is on (the *_pause_ctrl_phy counters stay 0); old PFC bursts remain.
        e["rx_prio3_pause"] = rng.choice((0, 0, 0, 12, 40))
        e["tx_prio3_pause"] = rng.choice((0, 0, 0, 5))
        e["link_down_events_phy"] = rng.choice((1, 1, 1, 2))
        # Checkpoint traffic on top of the dataset reads, bytes per second (a save writes, a restart reads).
        self.storage_write = 0.0
        self.storage_read = 0.0

    def port_of_gpu(self, gpu: int) -> Port:
        return self.ports[gpu % IB_PORTS]

    def step(self, dt: float, comm: list[float], rng: random.Random) -> None:
        """Advance `dt` seconds; `comm[g]` is GPU g's communication level (0..1) over that time."""
        for p in self.ports:
            level = comm[p.gpu] if p.gpu is not None and p.gpu < len(comm) else 0.0
            self._step_ib(p, dt, level if p.up else 0.0, rng)
        self._step_storage(dt, max(comm, default=0.0), rng)

    def _step_ib(self, p: Port, dt: float, level: float, rng: random.Random) -> None:
        if level > 0:
            sent = IB_PEAK_BYTES * level * dt * math.exp(rng.gauss(0, 0.03))
            p.add_traffic(sent, sent * (1 + rng.gauss(0, 0.01)))
        wait = XMIT_WAIT_PER_S * level * p.wait_scale * (p.congested or 1.0) * math.exp(rng.gauss(0, 0.3))
        p.counters["port_xmit_wait"] += count(rng, wait * dt)
        cnp = (CONGESTED_CNP_PER_S if p.congested else CNP_PER_S) * level * dt
        p.hw["np_cnp_sent"] += count(rng, cnp)
        p.hw["rp_cnp_handled"] += count(rng, cnp * 0.97)

    def _step_storage(self, dt: float, level: float, rng: random.Random) -> None:
        nic, stats, e = self.nic, self.nic.statistics, self.nic.ethtool
        rx = STORAGE_RX_BYTES * dt * math.exp(rng.gauss(0, 0.35))
        tx = STORAGE_TX_BYTES * dt * math.exp(rng.gauss(0, 0.35))
        if self.storage_write:
            tx += self.storage_write * dt * math.exp(rng.gauss(0, 0.1))
        if self.storage_read:
            rx += self.storage_read * dt * math.exp(rng.gauss(0, 0.1))
        for prefix, n in (("rx", rx), ("tx", tx)):
            packets = int(n / 8000)  # jumbo frames
            stats[f"{prefix}_bytes"] += int(n)
            stats[f"{prefix}_packets"] += packets
            e[f"{prefix}_bytes"] += int(n)
            e[f"{prefix}_packets"] += packets
            e[f"{prefix}_vport_rdma_unicast_bytes"] += int(n * 0.9)
            e[f"{prefix}_vport_rdma_unicast_packets"] += int(packets * 0.9)
        self.roce.add_traffic(tx, rx)
        stats["multicast"] += count(rng, 0.5 * dt)
        if nic.pausing:
            tx_pause = count(rng, CONGESTED_PAUSE_TX_PER_S * dt * math.exp(rng.gauss(0, 0.2)))
            rx_pause = count(rng, CONGESTED_PAUSE_RX_PER_S * dt * math.exp(rng.gauss(0, 0.2)))
            e["tx_prio3_pause"] += tx_pause
            e["rx_prio3_pause"] += rx_pause
            e["tx_prio3_pause_duration"] += int(tx_pause * 0.85)  # microseconds paused, ~one quantum each
            e["rx_prio3_pause_duration"] += int(rx_pause * 0.85)
            e["rx_prio3_pause_transition"] += count(rng, rx_pause * 0.2)
            e["rx_out_of_buffer"] += count(rng, 40 * dt)
        self.roce.hw["np_cnp_sent"] += count(rng, (CONGESTED_CNP_PER_S if nic.pausing else 0.05) * dt)
        self.roce.hw["rp_cnp_handled"] += count(rng, (CONGESTED_CNP_PER_S * 0.8 if nic.pausing else 0.05) * dt)

    def flap_down(self, gpu: int, rng: random.Random) -> None:
        """The GPU's IB port loses its link: error recovery first, then down; the PHY polls for a partner."""
        p = self.port_of_gpu(gpu)
        p.counters["link_error_recovery"] += rng.randint(1, 3)
        p.counters["link_downed"] += 1
        p.counters["symbol_error"] += rng.randint(8, 60)
        p.counters["port_rcv_errors"] += rng.randint(1, 6)
        p.counters["local_link_integrity_errors"] += rng.randint(0, 2)
        p.state, p.phys_state = DOWN, POLLING

    def link_trained(self, gpu: int) -> None:
        """The PHY found its partner again; the subnet manager has yet to activate the port."""
        p = self.port_of_gpu(gpu)
        p.state, p.phys_state = INIT, LINK_UP

    def port_active(self, gpu: int) -> None:
        p = self.port_of_gpu(gpu)
        p.state, p.phys_state = ACTIVE, LINK_UP

    def congest(self, factor: float) -> None:
        """The node's ports back up: IB credits run out (xmit_wait), the storage NIC sends and gets PFC pauses."""
        for p in self.ports:
            p.congested = factor
        self.nic.pausing = True

    def repair(self) -> None:
        self.storage_write = self.storage_read = 0.0
        for p in self.ports:
            p.state, p.phys_state, p.congested = ACTIVE, LINK_UP, 0.0
        self.nic.pausing = False


def count(rng: random.Random, mean: float) -> int:
    """A random count with this mean: Poisson for small means, its normal approximation for large ones."""
    if mean <= 0:
        return 0
    if mean < 30:
        limit, k, p = math.exp(-mean), 0, rng.random()
        while p > limit:
            k += 1
            p *= rng.random()
        return k
    return max(0, round(rng.gauss(mean, math.sqrt(mean))))


def _guid(node: int, index: int, rng: random.Random) -> int:
    # Mellanox OUI 0x946dae in the top bytes, then something unique per adapter.
    return (0x946DAE << 40) | ((node & 0xFFFF) << 24) | (index << 16) | rng.getrandbits(16)


def _mac(node: int, rng: random.Random) -> str:
    tail = [(node >> 8) & 0xFF, node & 0xFF, rng.getrandbits(8)]
    return ":".join(f"{b:02x}" for b in (0x94, 0x6D, 0xAE, *tail))


def pcie_bus(gpu: int) -> int:
    """PCI bus of the GPU's NIC: next to the GPU, behind the same PCIe switch."""
    return F.PCI_BUSES[gpu % len(F.PCI_BUSES)] - 1
