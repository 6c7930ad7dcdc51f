"""The GPU metrics faultline stores and the detectors read: DCGM field names to column names, and windows.

`ml/` owns these names so detectors and the service agree on them; the service stores one column per entry.
"""

from __future__ import annotations

from typing import Final

# column name -> (DCGM field names that feed it, is a cumulative counter needing float8)
# dcgm-exporter renamed CLOCK_THROTTLE_REASONS to CLOCKS_EVENT_REASONS; both land in one column.
METRIC_COLUMNS: Final[dict[str, tuple[tuple[str, ...], bool]]] = {
    "gpu_util": (("DCGM_FI_DEV_GPU_UTIL",), False),
    "mem_copy_util": (("DCGM_FI_DEV_MEM_COPY_UTIL",), False),
    "enc_util": (("DCGM_FI_DEV_ENC_UTIL",), False),
    "dec_util": (("DCGM_FI_DEV_DEC_UTIL",), False),
    "sm_clock": (("DCGM_FI_DEV_SM_CLOCK",), False),
    "mem_clock": (("DCGM_FI_DEV_MEM_CLOCK",), False),
    "gpu_temp": (("DCGM_FI_DEV_GPU_TEMP",), False),
    "memory_temp": (("DCGM_FI_DEV_MEMORY_TEMP",), False),
    "power_usage": (("DCGM_FI_DEV_POWER_USAGE",), False),
    "power_limit": (("DCGM_FI_DEV_POWER_MGMT_LIMIT",), False),
    "fb_free": (("DCGM_FI_DEV_FB_FREE",), False),
    "fb_used": (("DCGM_FI_DEV_FB_USED",), False),
    "xid_last": (("DCGM_FI_DEV_XID_ERRORS",), False),
    "clock_event_reasons": (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), True),
    "gr_engine_active": (("DCGM_FI_PROF_GR_ENGINE_ACTIVE",), False),
    "sm_active": (("DCGM_FI_PROF_SM_ACTIVE",), False),
    "sm_occupancy": (("DCGM_FI_PROF_SM_OCCUPANCY",), False),
    "tensor_active": (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",), False),
    "dram_active": (("DCGM_FI_PROF_DRAM_ACTIVE",), False),
    "total_energy": (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), True),
    "pcie_replay": (("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",), True),
    "power_violation": (("DCGM_FI_DEV_POWER_VIOLATION",), True),
    "thermal_violation": (("DCGM_FI_DEV_THERMAL_VIOLATION",), True),
    "ecc_sbe_volatile": (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), True),
    "ecc_dbe_volatile": (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), True),
    "remapped_rows_correctable": (("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",), True),
    "remapped_rows_uncorrectable": (("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",), True),
    "row_remap_failure": (("DCGM_FI_DEV_ROW_REMAP_FAILURE",), False),
    "nvlink_bandwidth_total": (("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",), True),
    "nvlink_crc_flit_errors": (("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",), True),
    "nvlink_crc_data_errors": (("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",), True),
    "nvlink_replay_errors": (("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",), True),
    "nvlink_recovery_errors": (("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",), True),
    "pcie_tx_bytes": (("DCGM_FI_PROF_PCIE_TX_BYTES",), True),
    "pcie_rx_bytes": (("DCGM_FI_PROF_PCIE_RX_BYTES",), True),
    "nvlink_tx_bytes": (("DCGM_FI_PROF_NVLINK_TX_BYTES",), True),
    "nvlink_rx_bytes": (("DCGM_FI_PROF_NVLINK_RX_BYTES",), True),
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
    "xid_last",
    "row_remap_failure",
)
