"""The machine-level metrics faultline stores beside the GPU ones: network ports, the host, volumes.

Agents ship them as `node_metrics` items (ts, subject, fields); the service stores one row per node, subject
and time in node_samples, one column per name below, and rolls them up into node_windows (WINDOW_S) like the
GPU metrics. A subject names what the row measures: `host`, an RDMA port (`ib:mlx5_0/1`, `roce:mlx5_2/1`), an
Ethernet netdev (`eth:eth0`) or a watched volume (`vol:/checkpoints`).
"""

from __future__ import annotations

from typing import Final

HOST: Final = "host"
PORT_KINDS: Final = ("ib", "roce", "eth")
SUBJECT_PATTERN: Final = r"^(host|(ib|roce):[A-Za-z0-9_.-]+/[0-9]+|eth:[A-Za-z0-9_.:@-]+|vol:/.*)$"

# Port gauges. IB port states (sysfs `state`): 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.
PORT_STATE: Final = "port_state"
PORT_PHYS_STATE: Final = "port_phys_state"
PORT_RATE_GBPS: Final = "port_rate_gbps"
PORT_ACTIVE: Final = 4.0

# Port counters (cumulative; the agent unwraps 32- and 64-bit wrap).
LINK_DOWNED: Final = "link_downed"
LINK_ERROR_RECOVERY: Final = "link_error_recovery"
SYMBOL_ERROR: Final = "symbol_error"
PORT_RCV_ERRORS: Final = "port_rcv_errors"
PORT_XMIT_DISCARDS: Final = "port_xmit_discards"
PORT_XMIT_WAIT: Final = "port_xmit_wait"
LOCAL_LINK_INTEGRITY_ERRORS: Final = "local_link_integrity_errors"
EXCESSIVE_BUFFER_OVERRUN_ERRORS: Final = "excessive_buffer_overrun_errors"
PORT_RCV_BYTES: Final = "port_rcv_bytes"
PORT_XMIT_BYTES: Final = "port_xmit_bytes"
NP_CNP_SENT: Final = "np_cnp_sent"
RP_CNP_HANDLED: Final = "rp_cnp_handled"
OUT_OF_BUFFER: Final = "out_of_buffer"
PAUSE_RX_FRAMES: Final = "pause_rx_frames"
PAUSE_TX_FRAMES: Final = "pause_tx_frames"
RX_ERRORS: Final = "rx_errors"
TX_ERRORS: Final = "tx_errors"
RX_DROPPED: Final = "rx_dropped"
TX_DROPPED: Final = "tx_dropped"

# Host gauges and counters.
CPU_UTIL_PCT: Final = "cpu_util_pct"
CPU_STEAL_PCT: Final = "cpu_steal_pct"
CPU_STEAL_MAX_CORE_PCT: Final = "cpu_steal_max_core_pct"
CPU_IOWAIT_PCT: Final = "cpu_iowait_pct"
CPU_IOWAIT_MAX_CORE_PCT: Final = "cpu_iowait_max_core_pct"
LOAD1: Final = "load1"
MEM_TOTAL_MIB: Final = "mem_total_mib"
MEM_AVAILABLE_MIB: Final = "mem_available_mib"
SWAP_USED_MIB: Final = "swap_used_mib"
PSI_CPU_SOME: Final = "psi_cpu_some_avg10"
PSI_MEM_SOME: Final = "psi_mem_some_avg10"
PSI_MEM_FULL: Final = "psi_mem_full_avg10"
PSI_IO_SOME: Final = "psi_io_some_avg10"
PSI_IO_FULL: Final = "psi_io_full_avg10"
NVIDIA_DRIVER_LOADED: Final = "nvidia_driver_loaded"
FABRIC_MANAGER_RUNNING: Final = "fabric_manager_running"
MCE_EVENTS: Final = "mce_events"
EDAC_CE: Final = "edac_ce"
EDAC_UE: Final = "edac_ue"
DISK_FREE_BYTES: Final = "disk_free_bytes"
DISK_TOTAL_BYTES: Final = "disk_total_bytes"
DISK_FREE_PCT: Final = "disk_free_pct"

# column -> is a cumulative counter (float8, and its window maximum kept as `<column>_max`)
NODE_COLUMNS: Final[dict[str, bool]] = {
    PORT_STATE: False,
    PORT_PHYS_STATE: False,
    PORT_RATE_GBPS: False,
    LINK_DOWNED: True,
    LINK_ERROR_RECOVERY: True,
    SYMBOL_ERROR: True,
    PORT_RCV_ERRORS: True,
    PORT_XMIT_DISCARDS: True,
    PORT_XMIT_WAIT: True,
    LOCAL_LINK_INTEGRITY_ERRORS: True,
    EXCESSIVE_BUFFER_OVERRUN_ERRORS: True,
    PORT_RCV_BYTES: True,
    PORT_XMIT_BYTES: True,
    NP_CNP_SENT: True,
    RP_CNP_HANDLED: True,
    OUT_OF_BUFFER: True,
    PAUSE_RX_FRAMES: True,
    PAUSE_TX_FRAMES: True,
    RX_ERRORS: True,
    TX_ERRORS: True,
    RX_DROPPED: True,
    TX_DROPPED: True,
    CPU_UTIL_PCT: False,
    CPU_STEAL_PCT: False,
    CPU_STEAL_MAX_CORE_PCT: False,
    CPU_IOWAIT_PCT: False,
    CPU_IOWAIT_MAX_CORE_PCT: False,
    LOAD1: False,
    MEM_TOTAL_MIB: False,
    MEM_AVAILABLE_MIB: False,
    SWAP_USED_MIB: False,
    PSI_CPU_SOME: False,
    PSI_MEM_SOME: False,
    PSI_MEM_FULL: False,
    PSI_IO_SOME: False,
    PSI_IO_FULL: False,
    NVIDIA_DRIVER_LOADED: False,
    FABRIC_MANAGER_RUNNING: False,
    MCE_EVENTS: True,
    EDAC_CE: True,
    EDAC_UE: True,
    DISK_FREE_BYTES: False,
    DISK_TOTAL_BYTES: False,
    DISK_FREE_PCT: False,
}
NODE_COUNTERS: Final[tuple[str, ...]] = tuple(c for c, counter in NODE_COLUMNS.items() if counter)
NODE_GAUGES: Final[tuple[str, ...]] = tuple(c for c, counter in NODE_COLUMNS.items() if not counter)

# Units, for evidence and plots.
UNITS: Final[dict[str, str]] = {
    PORT_RATE_GBPS: "Gb/s",
    PORT_RCV_BYTES: "B",
    PORT_XMIT_BYTES: "B",
    MEM_TOTAL_MIB: "MiB",
    MEM_AVAILABLE_MIB: "MiB",
    SWAP_USED_MIB: "MiB",
    DISK_FREE_BYTES: "B",
    DISK_TOTAL_BYTES: "B",
    **{c: "%" for c in NODE_COLUMNS if c.endswith("_pct") or c.startswith("psi_")},
}


def subject_kind(subject: str) -> str:
    """`host`, `ib`, `roce`, `eth` or `vol`."""
    return subject.split(":", 1)[0]


def is_port(subject: str) -> bool:
    return subject_kind(subject) in PORT_KINDS
