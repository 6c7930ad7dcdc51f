"""The node collectors' load for `faultline bench agent`: a fake sysfs of a busy multi-rail host, ticking.

The tree is laid out like the kernel's (tests/fixtures/sysfs/README.md): 8 InfiniBand ports (mlx5_0..7, 400
Gb/s NDR) with their PMA counters and mlx5 hw_counters, one RoCE port (mlx5_8, 200 Gb/s) with its netdev, two
physical Ethernet NICs with statistics and `ethtool -S` pause counters, and EDAC controllers. A thread in the
bench process (not the agent) moves every counter once a second, each file replaced whole as sysfs files
read. The host collector reads the real /proc, and a temporary folder is watched as a volume.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

IB_PORTS = 8
ROCE_PORTS = 1
ETH_NICS = 2

_PMA = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
    "port_rcv_constraint_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "VL15_dropped", "port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait",
    "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets",
)  # fmt: skip
_HW = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
    "req_remote_invalid_request", "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
    "resp_remote_access_errors", "rnr_nak_retry_err", "rx_atomic_requests", "rx_dct_connect", "rx_read_requests",
    "rx_write_requests",
)  # fmt: skip
_ROCE_HW = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored", "roce_adp_retrans")
_NET = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped",
        "rx_crc_errors", "rx_missed_errors", "multicast", "collisions")  # fmt: skip
# Per second at about half of line rate; the data counters count 4-byte words.
_RATES = {
    "port_xmit_data": 6_250_000_000, "port_rcv_data": 6_250_000_000, "port_xmit_packets": 6_000_000,
    "port_rcv_packets": 6_000_000, "unicast_xmit_packets": 6_000_000, "unicast_rcv_packets": 6_000_000,
    "port_xmit_wait": 40_000_000, "rx_write_requests": 3_000_000, "np_cnp_sent": 900, "rp_cnp_handled": 800,
    "np_ecn_marked_roce_packets": 950, "rx_bytes": 1_200_000_000, "tx_bytes": 1_100_000_000,
    "rx_packets": 300_000, "tx_packets": 280_000,
}  # fmt: skip


@dataclass
class NodeLoad:
    """What the agent is pointed at, and how to describe it."""

    sysfs: Path
    volume: Path

    @property
    def agent_args(self) -> list[str]:
        return ["--sysfs-root", str(self.sysfs), "--volume", str(self.volume)]

    @staticmethod
    def describe() -> str:
        return (
            f"network: {IB_PORTS} IB + {ROCE_PORTS} RoCE ports + {ETH_NICS} Ethernet NICs (fake sysfs, counters "
            "moving every 1 s); host: the real /proc, EDAC, 1 volume; read every ship tick"
        )


class _Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.counters: dict[Path, int] = {}  # file -> value, for the ticking thread
        self.ethtool: dict[Path, dict[str, int]] = {}
        self.rng = random.Random(16)

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def counter(self, relative: str, value: int) -> None:
        self.counters[self.write(relative, f"{value}\n")] = value

    def build(self) -> None:
        for i in range(IB_PORTS + ROCE_PORTS):
            roce = i >= IB_PORTS
            port = f"class/infiniband/mlx5_{i}/ports/1/"
            self.write(port + "state", "4: ACTIVE\n")
            self.write(port + "phys_state", "5: LinkUp\n")
            self.write(port + "rate", "200 Gb/sec (4X HDR)\n" if roce else "400 Gb/sec (4X NDR)\n")
            self.write(port + "link_layer", "Ethernet\n" if roce else "InfiniBand\n")
            for name in _PMA:
                self.counter(port + "counters/" + name, self.rng.randrange(10**12) if name in _RATES else 0)
            for name in _HW + (_ROCE_HW if roce else ()):
                self.counter(port + "hw_counters/" + name, 10 if name == "lifespan" else 0)
            if roce:
                self.write(f"class/infiniband/mlx5_{i}/device/net/ens{i}f0np0/dev_port", "0\n")
                self._netdev(f"ens{i}f0np0")
        for n in range(ETH_NICS):
            self._netdev(f"eno{n + 1}")
        for mc in range(2):
            self.counter(f"devices/system/edac/mc/mc{mc}/ce_count", 0)
            self.counter(f"devices/system/edac/mc/mc{mc}/ue_count", 0)

    def _netdev(self, name: str) -> None:
        self.write(f"class/net/{name}/type", "1\n")
        (self.root / f"class/net/{name}/device").mkdir(parents=True, exist_ok=True)
        for stat in _NET:
            self.counter(f"class/net/{name}/statistics/{stat}", 0)
        stats = {f"{d}_prio{p}_{k}": 0 for d in ("rx", "tx") for p in range(8) for k in ("bytes", "packets", "pause")}
        stats.update(rx_pause_ctrl_phy=0, tx_pause_ctrl_phy=0, rx_bytes_phy=0, tx_bytes_phy=0)
        self.ethtool[self.root / f"class/net/{name}/ethtool_stats"] = stats
        self._write_ethtool()

    def tick(self) -> None:
        """One second of a busy node: traffic, congestion, and now and then an error."""
        for path, value in self.counters.items():
            name = path.name
            step = _RATES.get(name, 0)
            if not step and self.rng.random() < 0.01:
                step = 1  # a rare error or drop
            if step:
                value += int(step * self.rng.uniform(0.8, 1.2)) if step > 1 else step
                self.counters[path] = value
                _replace(path, f"{value}\n")
        for stats in self.ethtool.values():
            for name in ("rx_prio3_pause", "tx_prio3_pause"):
                stats[name] += self.rng.randrange(50)
        self._write_ethtool()

    def _write_ethtool(self) -> None:
        for path, stats in self.ethtool.items():
            _replace(path, "NIC statistics:\n" + "".join(f"     {k}: {v}\n" for k, v in stats.items()))


def _replace(path: Path, text: str) -> None:
    # Whole-file replacement: the agent never reads half a number, as it never does from sysfs.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def node_load(root: Path) -> Iterator[NodeLoad]:
    """Build the fake tree under `root` and keep its counters moving until the block ends."""
    tree = _Tree(root / "sys")
    tree.build()
    volume = root / "checkpoints"
    volume.mkdir()
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(1.0):
            tree.tick()

    thread = threading.Thread(target=run, name="fake-sysfs", daemon=True)
    thread.start()
    try:
        yield NodeLoad(sysfs=tree.root, volume=volume)
    finally:
        stop.set()
        thread.join(timeout=5)
