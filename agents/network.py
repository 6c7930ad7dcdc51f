"""The network collector: every InfiniBand/RoCE port and every physical Ethernet NIC, from sysfs.

Layout read (Documentation/ABI/stable/sysfs-class-infiniband, drivers/infiniband/core/sysfs.c,
drivers/infiniband/hw/mlx5/counters.c, Documentation/ABI/testing/sysfs-class-net-statistics):
  class/infiniband/<dev>/ports/<port>/{state,phys_state,rate,link_layer}   "4: ACTIVE", "5: LinkUp",
                                                                          "400 Gb/sec (4X NDR)", "InfiniBand"
  class/infiniband/<dev>/ports/<port>/counters/<name>     PMA PortCounters(Extended), one integer each
  class/infiniband/<dev>/ports/<port>/hw_counters/<name>  driver counters (mlx5: out_of_buffer, np_cnp_sent, ...)
  class/infiniband/<dev>/device/net/<netdev>              the netdev of a RoCE port
  class/net/<netdev>/{type,device,statistics/<name>}      type 1 is Ethernet; `device` marks a physical NIC
Subjects and names follow the wire contract (ml/node_metrics.py on the service side): `ib:<dev>/<port>` for
an InfiniBand link layer, `roce:<dev>/<port>` for an Ethernet one, `eth:<netdev>` for the other NICs.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from agents.counters import CounterTracker
from agents.ethtool import FileStats, IoctlStats, PauseReader
from agents.kfiles import list_dir, read_int, read_text

log = logging.getLogger(__name__)

_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*Gb/sec")
_LEADING_NUMBER = re.compile(r"^(\d+)")

# IB PortCounters fields stop at their maximum (IBA vol. 1, PortCounters; widths as the kernel's PORT_PMA_ATTR
# declarations in drivers/infiniband/core/sysfs.c): file -> bits.
SATURATING: dict[str, int] = {
    "port_xmit_wait": 32,
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
}
# The data counters: 64 bits from PortCountersExtended on HCAs that have them (PORT_PMA_ATTR_EXT; mlx5 does),
# else 32, so the width is inferred from the values. file -> (wire name, factor): they count 4-byte words.
WRAPPING: dict[str, tuple[str, int]] = {
    "port_rcv_data": ("port_rcv_bytes", 4),
    "port_xmit_data": ("port_xmit_bytes", 4),
}
# mlx5 hw_counters: firmware Q and congestion counters that wrap (32 bits for the Q counters).
HW_COUNTERS: tuple[str, ...] = ("np_cnp_sent", "rp_cnp_handled", "out_of_buffer")
# /sys/class/net/<netdev>/statistics: unsigned 64-bit (struct rtnl_link_stats64).
NET_STATISTICS: tuple[str, ...] = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
ARPHRD_ETHER = 1
IB_PORT_DOWN = 1  # the lowest state a port reports (include/rdma/ib_verbs.h enum ib_port_state; 0 is NOP)


@dataclass
class _Port:
    """One RDMA port as found at discovery: its files, and which of the wanted counters its driver has."""

    subject: str
    path: str
    counters: list[str]
    hw_counters: list[str]
    netdev: str | None = None


@dataclass
class _Nic:
    subject: str
    netdev: str
    statistics: list[str] = field(default_factory=list)
    pause: bool = True  # False for a RoCE port's netdev: its pause counters go on the roce: subject


class NetworkCollector:
    """Reads every port once per call; remembers per port which counters its driver lacks."""

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys", *, tracker: CounterTracker | None = None) -> None:
        self.root = os.fspath(sysfs_root)
        self.ib_dir = os.path.join(self.root, "class", "infiniband")
        self.net_dir = os.path.join(self.root, "class", "net")
        self.tracker = tracker or CounterTracker()
        real = os.path.realpath(self.root) == "/sys"
        self.pause: PauseReader = IoctlStats() if real else FileStats(self.root)
        self._ports: dict[tuple[str, str], _Port] = {}
        self._nics: dict[str, _Nic] = {}
        self._not_nics: set[str] = set()  # veth, bridges, IPoIB...: looked at once
        self._said_no_rdma = False
        self.rdma: bool | None = None

    @property
    def subjects(self) -> list[str]:
        """Subjects of the ports and NICs seen at the last read."""
        return [p.subject for p in self._ports.values()] + [n.subject for n in self._nics.values()]

    def read(self, ts: str) -> list[dict[str, Any]]:
        """One item per port and NIC: gauges and unwrapped counters at `ts`."""
        items: list[dict[str, Any]] = []
        self._discover_ports()
        roce_netdevs: set[str] = set()
        for key, port in list(self._ports.items()):
            fields = self._read_port(port)
            if fields is None:  # the port vanished between discovery and now: hot-removed
                self._drop_port(key)
                continue
            if port.netdev:
                roce_netdevs.add(port.netdev)
            items.append({"ts": ts, "subject": port.subject, "fields": fields})
        self._discover_nics(roce_netdevs)
        for name, nic in list(self._nics.items()):
            fields = self._read_nic(nic)
            if fields is None:
                self._nics.pop(name)
                self.tracker.forget(nic.subject)
                continue
            items.append({"ts": ts, "subject": nic.subject, "fields": fields})
        return items

    def link_states(self) -> dict[str, tuple[int | None, int | None]]:
        """Each known RDMA port's (state, link_downed) as the kernel shows them now: two small files a port, cheap
        enough for every sample tick (agents/port_watch.py). Ports are found by `read`, at the ship tick."""
        out: dict[str, tuple[int | None, int | None]] = {}
        for port in list(self._ports.values()):
            state = read_text(os.path.join(port.path, "state"))
            if state is None:
                continue  # vanished: `read` drops it
            downed = (
                read_int(os.path.join(port.path, "counters", "link_downed")) if "link_downed" in port.counters else None
            )
            out[port.subject] = (_port_state(state), downed)
        return out

    def close(self) -> None:
        if isinstance(self.pause, IoctlStats):
            self.pause.close()

    # -- RDMA ports ------------------------------------------------------------------------------

    def _discover_ports(self) -> None:
        seen: set[tuple[str, str]] = set()
        devices = list_dir(self.ib_dir)
        for dev in devices:
            for port in list_dir(os.path.join(self.ib_dir, dev, "ports")):
                key = (dev, port)
                seen.add(key)
                if key not in self._ports and (found := self._new_port(dev, port)) is not None:
                    self._ports[key] = found
        for key in set(self._ports) - seen:
            self._drop_port(key)
        self.rdma = bool(devices)
        if not devices and not self._said_no_rdma:
            log.info("no RDMA device under %s: no InfiniBand/RoCE port metrics on this host", self.ib_dir)
            self._said_no_rdma = True

    def _new_port(self, dev: str, port: str) -> _Port | None:
        if not port.isdigit():
            return None
        path = os.path.join(self.ib_dir, dev, "ports", port)
        link_layer = read_text(os.path.join(path, "link_layer"))
        if link_layer is None:
            return None  # half-created or being removed: look again next time
        roce = link_layer.lower() == "ethernet"
        present = set(list_dir(os.path.join(path, "counters")))
        present_hw = set(list_dir(os.path.join(path, "hw_counters")))
        wanted = [*SATURATING, *WRAPPING]
        return _Port(
            subject=f"{'roce' if roce else 'ib'}:{dev}/{port}",
            path=path,
            # Absent on this driver: skipped quietly from now on (not tried again every tick).
            counters=[name for name in wanted if name in present],
            hw_counters=[name for name in HW_COUNTERS if name in present_hw],
            netdev=self._roce_netdev(dev, int(port)) if roce else None,
        )

    def _roce_netdev(self, dev: str, port: int) -> str | None:
        """The netdev under the RoCE device's PCI function; with several, the one whose dev_port matches."""
        net = os.path.join(self.ib_dir, dev, "device", "net")
        names = list_dir(net)
        if len(names) > 1:
            for name in names:
                if read_int(os.path.join(net, name, "dev_port")) == port - 1:
                    return name
        return names[0] if names else None

    def _drop_port(self, key: tuple[str, str]) -> None:
        port = self._ports.pop(key, None)
        if port is not None:
            log.info("%s is gone (device removed?); it is no longer read", port.subject)
            self.tracker.forget(port.subject)

    def _read_port(self, port: _Port) -> dict[str, float | int | None] | None:
        state = read_text(os.path.join(port.path, "state"))
        if state is None:
            return None
        fields: dict[str, float | int | None] = {"port_state": _port_state(state)}
        phys = read_text(os.path.join(port.path, "phys_state"))
        fields["port_phys_state"] = _leading_int(phys) if phys else None
        rate = read_text(os.path.join(port.path, "rate"))
        match = _RATE.match(rate or "")
        fields["port_rate_gbps"] = float(match.group(1)) if match else None
        track = self.tracker
        counters = os.path.join(port.path, "counters")
        for name in port.counters:
            raw = read_int(os.path.join(counters, name))
            if raw is None:
                continue
            if name in SATURATING:
                fields[name] = track.saturating(port.subject, name, raw, SATURATING[name])
            else:
                wire, factor = WRAPPING[name]
                fields[wire] = _num(track.wrapping(port.subject, name, raw) * factor)
        hw = os.path.join(port.path, "hw_counters")
        for name in port.hw_counters:
            raw = read_int(os.path.join(hw, name))
            if raw is not None:
                fields[name] = _num(track.wrapping(port.subject, name, raw))
        if port.netdev:
            self._add_pause(fields, port.subject, port.netdev)
        return fields

    # -- Ethernet NICs ---------------------------------------------------------------------------

    def _discover_nics(self, roce_netdevs: set[str]) -> None:
        names = [n for n in list_dir(self.net_dir) if n != "lo"]
        for name in names:
            if name not in self._nics and name not in self._not_nics:
                nic = self._new_nic(name)
                if nic is None:
                    self._not_nics.add(name)
                else:
                    self._nics[name] = nic
            if name in self._nics:
                self._nics[name].pause = name not in roce_netdevs
        for name in set(self._nics) - set(names):
            self.tracker.forget(self._nics.pop(name).subject)
        self._not_nics &= set(names)  # a name reused later (a container's veth, a new NIC) is looked at again

    def _new_nic(self, name: str) -> _Nic | None:
        path = os.path.join(self.net_dir, name)
        # Physical NICs have a `device` link; veth, bridges, bonds and tunnels do not. IPoIB (type 32) is the
        # IB port already read.
        if not os.path.lexists(os.path.join(path, "device")) or read_int(os.path.join(path, "type")) != ARPHRD_ETHER:
            return None
        present = set(list_dir(os.path.join(path, "statistics")))
        return _Nic(subject=f"eth:{name}", netdev=name, statistics=[s for s in NET_STATISTICS if s in present])

    def _read_nic(self, nic: _Nic) -> dict[str, float | int | None] | None:
        stats = os.path.join(self.net_dir, nic.netdev, "statistics")
        fields: dict[str, float | int | None] = {}
        for name in nic.statistics:
            raw = read_int(os.path.join(stats, name))
            if raw is not None:
                fields[name] = _num(self.tracker.wrapping(nic.subject, name, raw, 64))
        if not fields and nic.statistics:
            return None  # every file gone: the NIC was removed
        if nic.pause:
            self._add_pause(fields, nic.subject, nic.netdev)
        return fields

    def _add_pause(self, fields: dict[str, float | int | None], subject: str, netdev: str) -> None:
        totals = self.pause.read(netdev)
        for direction, value in (totals or {}).items():
            name = f"pause_{direction}_frames"
            fields[name] = _num(self.tracker.wrapping(subject, name, value, 64))


def _port_state(text: str) -> int | None:
    """The port's state, or None where it is unknown: 0 is the kernel's NOP ("0: NOP", nothing reported yet),
    not DOWN. Shipped as a number it would pull the window's mean below ACTIVE and read as a flap."""
    state = _leading_int(text)
    return state if state is not None and state >= IB_PORT_DOWN else None


def _leading_int(text: str) -> int | None:
    match = _LEADING_NUMBER.match(text)
    return int(match.group(1)) if match else None


def _num(value: int) -> int | float:
    """JSON-safe: an unwrapped 64-bit counter can pass 2**63, beyond what JSON encoders take as an integer."""
    return value if value < 2**63 else float(value)
