"""PFC and global pause frame counters of an Ethernet netdev, as `ethtool -S` shows them.

The kernel has no sysfs file for pause frames: drivers expose them only as ethtool statistics (mlx5:
rx_pause_ctrl_phy / tx_pause_ctrl_phy for global pause, rx_prioN_pause / tx_prioN_pause per PFC priority).
On a real host they are read with the SIOCETHTOOL ioctl (ETHTOOL_GSSET_INFO for the count, ETHTOOL_GSTRINGS
for the names once, ETHTOOL_GSTATS for the values; no privilege needed, as for `ethtool -S`). Under a fake
sysfs root (--sysfs-root: a tree laid out like the kernel's) the same names and values come from
`class/net/<netdev>/ethtool_stats`, a file of `name: value` lines exactly as `ethtool -S` prints them.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import re
import socket
import struct
from typing import Protocol

SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETHTOOL_GSSET_INFO = 0x00000037
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
# struct ifreq is 40 bytes on 64-bit Linux: the name, then a union whose ethtool member is a pointer.
_IFREQ = struct.Struct(f"{IFNAMSIZ}sP")
_IFREQ_SIZE = 40

# The counters summed into pause_rx_frames / pause_tx_frames: global pause and every PFC priority. Not the
# *_pause_duration or *_pause_transition counters mlx5 has beside them (microseconds and edges, not frames).
_PAUSE = re.compile(r"^(rx|tx)_(?:pause_ctrl_phy|prio[0-7]_pause)$")


class PauseReader(Protocol):
    def read(self, netdev: str) -> dict[str, int] | None: ...


def pause_totals(stats: dict[str, int]) -> dict[str, int]:
    """{"rx": frames, "tx": frames} summed over the pause counters present; empty if the driver has none."""
    totals: dict[str, int] = {}
    for name, value in stats.items():
        match = _PAUSE.match(name)
        if match:
            totals[match.group(1)] = totals.get(match.group(1), 0) + value
    return totals


def parse_ethtool_s(text: str) -> dict[str, int]:
    """`ethtool -S` output ("NIC statistics:" then "     name: value" lines) as a dict."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(":")
        if sep and name:
            try:
                stats[name.strip()] = int(value)
            except ValueError:
                continue  # the "NIC statistics:" header
    return stats


class FileStats:
    """Pause counters from `<sysfs>/class/net/<netdev>/ethtool_stats` (fake trees only)."""

    def __init__(self, sysfs_root: str) -> None:
        self.net = os.path.join(sysfs_root, "class", "net")

    def read(self, netdev: str) -> dict[str, int] | None:
        try:
            with open(os.path.join(self.net, netdev, "ethtool_stats")) as f:
                return pause_totals(parse_ethtool_s(f.read()))
        except OSError:
            return None


class IoctlStats:
    """Pause counters through ETHTOOL_GSTATS; the names and their positions are looked up once per netdev."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        # netdev -> (number of stats, positions of the rx pause counters, positions of the tx ones)
        self._layout: dict[str, tuple[int, list[int], list[int]]] = {}
        self._unsupported: set[str] = set()

    def read(self, netdev: str) -> dict[str, int] | None:
        if netdev in self._unsupported:
            return None
        layout = self._layout.get(netdev)
        if layout is None:
            try:
                layout = self._learn(netdev)
            except OSError as exc:
                if exc.errno != errno.ENODEV:  # EOPNOTSUPP and the like: this driver has no ethtool stats
                    self._unsupported.add(netdev)
                return None
            if layout is None:
                self._unsupported.add(netdev)  # no pause counters among its stats: do not ask again
                return None
        count, rx, tx = layout
        try:
            values = self._stats(netdev, count)
        except OSError:
            values = None  # gone or renamed: learn again if it comes back
        if values is None:  # or the driver's stat set changed size (a reconfiguration)
            self._layout.pop(netdev, None)
            return None
        totals = {}
        if rx:
            totals["rx"] = sum(values[i] for i in rx)
        if tx:
            totals["tx"] = sum(values[i] for i in tx)
        return totals

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _ioctl(self, netdev: str, data: array.array[int]) -> None:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        address, _ = data.buffer_info()
        ifreq = bytearray(_IFREQ_SIZE)
        _IFREQ.pack_into(ifreq, 0, netdev.encode()[: IFNAMSIZ - 1], address)
        fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifreq)

    def _count(self, netdev: str) -> int:
        # struct ethtool_sset_info {u32 cmd; u32 reserved; u64 sset_mask; u32 data[]}: one set asked, one answer.
        buf = array.array("B", struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0))
        self._ioctl(netdev, buf)
        _, _, mask, count = struct.unpack("=IIQI", buf.tobytes())
        return count if mask & (1 << ETH_SS_STATS) else 0

    def _names(self, netdev: str, count: int) -> list[str]:
        # struct ethtool_gstrings {u32 cmd; u32 string_set; u32 len; u8 data[len * ETH_GSTRING_LEN]}
        buf = array.array("B", struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_STATS, count))
        buf.extend(bytes(count * ETH_GSTRING_LEN))
        self._ioctl(netdev, buf)
        raw = buf.tobytes()[12:]
        return [
            raw[i * ETH_GSTRING_LEN : (i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
            for i in range(count)
        ]

    def _stats(self, netdev: str, count: int) -> tuple[int, ...] | None:
        # struct ethtool_stats {u32 cmd; u32 n_stats; u64 data[n_stats]}
        buf = array.array("B", struct.pack("=II", ETHTOOL_GSTATS, count))
        buf.extend(bytes(8 * count))
        self._ioctl(netdev, buf)
        _, n_stats = struct.unpack_from("=II", buf)
        if n_stats != count:
            return None
        return struct.unpack_from(f"={count}Q", buf, 8)

    def _learn(self, netdev: str) -> tuple[int, list[int], list[int]] | None:
        count = self._count(netdev)
        if count <= 0:
            return None
        names = self._names(netdev, count)
        rx = [i for i, n in enumerate(names) if (m := _PAUSE.match(n)) and m.group(1) == "rx"]
        tx = [i for i, n in enumerate(names) if (m := _PAUSE.match(n)) and m.group(1) == "tx"]
        if not rx and not tx:
            return None
        self._layout[netdev] = (count, rx, tx)
        return self._layout[netdev]


def stats_by_name(netdev: str) -> dict[str, int]:
    """Every ethtool statistic of a netdev by name (what `ethtool -S` prints); for tests and diagnosis."""
    reader = IoctlStats()
    try:
        count = reader._count(netdev)
        names = reader._names(netdev, count) if count else []
        values = reader._stats(netdev, count) if count else ()
        return dict(zip(names, values or (), strict=False))
    finally:
        reader.close()
