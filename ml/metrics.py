"""The GPU metrics faultline stores and the detectors read: DCGM field names to column names, and windows.

`ml/` owns these names so detectors and the service agree on them; the service stores one column per entry.
"""

from __future__ import annotations

from typing import Final

# One constant per column, so that detectors and the service name a column without spelling it.
GPU_UTIL: Final = "gpu_util"
MEM_COPY_UTIL: Final = "mem_copy_util"
ENC_UTIL: Final = "enc_util"
DEC_UTIL: Final = "dec_util"
SM_CLOCK: Final = "sm_clock"
MEM_CLOCK: Final = "mem_clock"
GPU_TEMP: Final = "gpu_temp"
MEMORY_TEMP: Final = "memory_temp"
POWER_USAGE: Final = "power_usage"
POWER_LIMIT: Final = "power_limit"
FB_FREE: Final = "fb_free"
FB_USED: Final = "fb_used"
XID_LAST: Final = "xid_last"
CLOCK_EVENT_REASONS: Final = "clock_event_reasons"
GR_ENGINE_ACTIVE: Final = "gr_engine_active"
SM_ACTIVE: Final = "sm_active"
SM_OCCUPANCY: Final = "sm_occupancy"
TENSOR_ACTIVE: Final = "tensor_active"
DRAM_ACTIVE: Final = "dram_active"
TOTAL_ENERGY: Final = "total_energy"
PCIE_REPLAY: Final = "pcie_replay"
POWER_VIOLATION: Final = "power_violation"
THERMAL_VIOLATION: Final = "thermal_violation"
ECC_SBE_VOLATILE: Final = "ecc_sbe_volatile"
ECC_DBE_VOLATILE: Final = "ecc_dbe_volatile"
REMAPPED_ROWS_CORRECTABLE: Final = "remapped_rows_correctable"
REMAPPED_ROWS_UNCORRECTABLE: Final = "remapped_rows_uncorrectable"
ROW_REMAP_FAILURE: Final = "row_remap_failure"
NVLINK_BANDWIDTH_TOTAL: Final = "nvlink_bandwidth_total"
NVLINK_CRC_FLIT_ERRORS: Final = "nvlink_crc_flit_errors"
NVLINK_CRC_DATA_ERRORS: Final = "nvlink_crc_data_errors"
NVLINK_REPLAY_ERRORS: Final = "nvlink_replay_errors"
NVLINK_RECOVERY_ERRORS: Final = "nvlink_recovery_errors"
PCIE_TX_BYTES: Final = "pcie_tx_bytes"
PCIE_RX_BYTES: Final = "pcie_rx_bytes"
NVLINK_TX_BYTES: Final = "nvlink_tx_bytes"
NVLINK_RX_BYTES: Final = "nvlink_rx_bytes"
ROW_REMAP_PENDING: Final = "row_remap_pending"
RETIRED_PAGES_SBE: Final = "retired_pages_sbe"
RETIRED_PAGES_DBE: Final = "retired_pages_dbe"
RETIRED_PAGES_PENDING: Final = "retired_pages_pending"
ECC_SBE_AGGREGATE: Final = "ecc_sbe_aggregate"
ECC_DBE_AGGREGATE: Final = "ecc_dbe_aggregate"
PCIE_LINK_GEN: Final = "pcie_link_gen"
PCIE_LINK_WIDTH: Final = "pcie_link_width"
PCIE_MAX_LINK_GEN: Final = "pcie_max_link_gen"
PCIE_MAX_LINK_WIDTH: Final = "pcie_max_link_width"
NVLINK_LINKS_DOWN: Final = "nvlink_links_down"

# column name -> (DCGM field names that feed it, is a cumulative counter needing float8)
# dcgm-exporter renamed CLOCK_THROTTLE_REASONS to CLOCKS_EVENT_REASONS; both land in one column.
METRIC_COLUMNS: Final[dict[str, tuple[tuple[str, ...], bool]]] = {
    GPU_UTIL: (("DCGM_FI_DEV_GPU_UTIL",), False),
    MEM_COPY_UTIL: (("DCGM_FI_DEV_MEM_COPY_UTIL",), False),
    ENC_UTIL: (("DCGM_FI_DEV_ENC_UTIL",), False),
    DEC_UTIL: (("DCGM_FI_DEV_DEC_UTIL",), False),
    SM_CLOCK: (("DCGM_FI_DEV_SM_CLOCK",), False),
    MEM_CLOCK: (("DCGM_FI_DEV_MEM_CLOCK",), False),
    GPU_TEMP: (("DCGM_FI_DEV_GPU_TEMP",), False),
    MEMORY_TEMP: (("DCGM_FI_DEV_MEMORY_TEMP",), False),
    POWER_USAGE: (("DCGM_FI_DEV_POWER_USAGE",), False),
    POWER_LIMIT: (("DCGM_FI_DEV_POWER_MGMT_LIMIT",), False),
    FB_FREE: (("DCGM_FI_DEV_FB_FREE",), False),
    FB_USED: (("DCGM_FI_DEV_FB_USED",), False),
    XID_LAST: (("DCGM_FI_DEV_XID_ERRORS",), False),
    CLOCK_EVENT_REASONS: (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), True),
    GR_ENGINE_ACTIVE: (("DCGM_FI_PROF_GR_ENGINE_ACTIVE",), False),
    SM_ACTIVE: (("DCGM_FI_PROF_SM_ACTIVE",), False),
    SM_OCCUPANCY: (("DCGM_FI_PROF_SM_OCCUPANCY",), False),
    TENSOR_ACTIVE: (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",), False),
    DRAM_ACTIVE: (("DCGM_FI_PROF_DRAM_ACTIVE",), False),
    TOTAL_ENERGY: (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), True),
    PCIE_REPLAY: (("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",), True),
    POWER_VIOLATION: (("DCGM_FI_DEV_POWER_VIOLATION",), True),
    THERMAL_VIOLATION: (("DCGM_FI_DEV_THERMAL_VIOLATION",), True),
    ECC_SBE_VOLATILE: (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), True),
    ECC_DBE_VOLATILE: (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), True),
    REMAPPED_ROWS_CORRECTABLE: (("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",), True),
    REMAPPED_ROWS_UNCORRECTABLE: (("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",), True),
    ROW_REMAP_FAILURE: (("DCGM_FI_DEV_ROW_REMAP_FAILURE",), False),
    NVLINK_BANDWIDTH_TOTAL: (("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",), True),
    NVLINK_CRC_FLIT_ERRORS: (("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",), True),
    NVLINK_CRC_DATA_ERRORS: (("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",), True),
    NVLINK_REPLAY_ERRORS: (("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",), True),
    NVLINK_RECOVERY_ERRORS: (("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",), True),
    PCIE_TX_BYTES: (("DCGM_FI_PROF_PCIE_TX_BYTES",), True),
    PCIE_RX_BYTES: (("DCGM_FI_PROF_PCIE_RX_BYTES",), True),
    NVLINK_TX_BYTES: (("DCGM_FI_PROF_NVLINK_TX_BYTES",), True),
    NVLINK_RX_BYTES: (("DCGM_FI_PROF_NVLINK_RX_BYTES",), True),
    ROW_REMAP_PENDING: (("DCGM_FI_DEV_ROW_REMAP_PENDING",), False),
    RETIRED_PAGES_SBE: (("DCGM_FI_DEV_RETIRED_SBE",), True),
    RETIRED_PAGES_DBE: (("DCGM_FI_DEV_RETIRED_DBE",), True),
    RETIRED_PAGES_PENDING: (("DCGM_FI_DEV_RETIRED_PENDING",), False),
    ECC_SBE_AGGREGATE: (("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",), True),
    ECC_DBE_AGGREGATE: (("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",), True),
    PCIE_LINK_GEN: (("DCGM_FI_DEV_PCIE_LINK_GEN",), False),
    PCIE_LINK_WIDTH: (("DCGM_FI_DEV_PCIE_LINK_WIDTH",), False),
    PCIE_MAX_LINK_GEN: (("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",), False),
    PCIE_MAX_LINK_WIDTH: (("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",), False),
    # Not a DCGM field: the agent's NVML fallback counts the NVLinks that answer inactive.
    NVLINK_LINKS_DOWN: (("FAULTLINE_NVLINK_LINKS_DOWN",), False),
}

FIELD_TO_COLUMN: Final[dict[str, str]] = {
    field: column for column, (fields, _) in METRIC_COLUMNS.items() for field in fields
}

# Window aggregates (service: metric_windows): every column's mean per GPU and window, and for cumulative
# counters and codes also the maximum, which is the last value unless the counter reset inside the window.
# 10 s: a third of the peer comparison's 30 s sub-window, the progress detector's bucket, a fail-slow round;
# two agent shipments (5 s) fill one.
WINDOW_S: Final[float] = 10.0
WINDOW_MAX_COLUMNS: Final[tuple[str, ...]] = (
    *(column for column, (_, counter) in METRIC_COLUMNS.items() if counter),
    XID_LAST,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    RETIRED_PAGES_PENDING,
    NVLINK_LINKS_DOWN,
)

# nvmlClocksEventReason* bits (DCGM_FI_DEV_CLOCKS_EVENT_REASONS), by name.
CLOCK_EVENT_BITS: Final[dict[str, int]] = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}


def clock_event_flags(mask: float | int | None) -> list[str]:
    """The named reasons set in a clock-events bitmask (empty for none or an unreadable value)."""
    if mask is None or mask != mask or mask < 0:
        return []
    bits = int(mask)
    return [name for name, bit in CLOCK_EVENT_BITS.items() if bits & bit]
