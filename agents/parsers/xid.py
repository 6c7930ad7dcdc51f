"""Xid codes: mnemonic, NVIDIA's immediate action, and how urgently the agent ships them.

Baked in from the catalog in corpus/formats/xid_catalog_nvidia_via_gpud.tsv (leptonai/gpud
components/accelerator/nvidia/xid/catalog_generated.go @4a8de33a, generated 2025-10-29 from
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). The agent must not read that
file at run time (it is not installed on the nodes), so the table lives here; refresh it by hand.

Severity rule, from the catalog's immediate_action column:
- the GPU or the machine needs a reset/reboot or a hardware workflow (RESET_GPU, RESTART_BM,
  RESTART_VM, CONTACT_SUPPORT, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR) -> critical
- only the application needs a restart, or something to check (RESTART_APP, CHECK_*, UPDATE_SWFW,
  WORKFLOW_XID_45, which is usually a consequence of another Xid) -> error
- IGNORE, and the informational XID_154 -> warning (154 is raised to critical by the parser when it
  says a reset or reboot is required)
- except the codes the service acts on at once although the catalog's action is mild (_RAISED_TO_CRITICAL), so
  they reach it at once like every other Xid that takes a GPU out
Codes 162-172 have no action in the catalog yet; their names say what they are (see _NO_ACTION below).
"""

from __future__ import annotations

from dataclasses import dataclass

# code -> (mnemonic, immediate_action); "" where the catalog has no action yet.
XID_CATALOG: dict[int, tuple[str, str]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP"),
    11: ("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP"),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    25: ("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP"),
    37: ("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE"),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE"),
    39: ("ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP"),
    40: ("ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP"),
    41: ("ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    44: ("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    60: ("ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP"),
    62: ("PMU_HALT_ERROR", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    66: ("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE"),
    67: ("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE"),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP"),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    70: ("ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP"),
    71: ("ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP"),
    72: ("ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    75: ("ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP"),
    76: ("ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP"),
    77: ("ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP"),
    78: ("VGPU_START_ERROR", "UPDATE_SWFW"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP"),
    82: ("ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP"),
    83: ("ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP"),
    84: ("ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP"),
    85: ("ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP"),
    86: ("ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP"),
    88: ("ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP"),
    89: ("ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    93: ("INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    96: ("ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP"),
    97: ("ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP"),
    98: ("ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP"),
    99: ("ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP"),
    100: ("ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP"),
    101: ("ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP"),
    102: ("ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP"),
    103: ("ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP"),
    104: ("ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP"),
    105: ("ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP"),
    106: ("SMBPBI_TEST_MESSAGE", "IGNORE"),
    107: ("SMBPBI_TEST_MESSAGE_SILENT", "IGNORE"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    110: ("SEC_FAULT_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
    121: ("C2C_ERROR", "IGNORE"),
    126: ("ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP"),
    127: ("ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP"),
    128: ("ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP"),
    129: ("ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP"),
    130: ("ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP"),
    131: ("ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP"),
    132: ("ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP"),
    133: ("ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP"),
    134: ("ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP"),
    135: ("ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP"),
    136: ("ALI_TRAINING_FAIL", "RESET_GPU"),
    137: ("NVLINK_PRIV_ERR", "IGNORE"),
    139: ("ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    141: ("ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE"),
    142: ("ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT"),
    143: ("GPU_INIT_ERROR", "RESET_GPU"),
    144: ("NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM"),
    152: ("ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE"),
    153: ("ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    155: ("NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "IGNORE"),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU"),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM"),
    160: ("CHANNEL_RETIREMENT_EVENT", "IGNORE"),
    161: ("CHANNEL_RETIREMENT_FAILURE", "IGNORE"),
    162: ("PSHC_REENGAGED", ""),
    163: ("PSHC_DISENGAGED", ""),
    164: ("PSHC_LOW_LIFETIME", ""),
    165: ("PSHC_ZERO_LIFETIME", ""),
    166: ("NVLINK_SECURE_CRYPTO_ERR", ""),
    167: ("PCIE_FATAL_TIMEOUT", ""),
    168: ("REDUCED_GPU_MEMORY_CAPACITY", ""),
    169: ("SEC2_HALT_ERROR", ""),
    170: ("NVLINK_SECURE_OTHER", ""),
    171: ("UNCORRECTABLE_DRAM_ERROR", ""),
    172: ("UNCORRECTABLE_SRAM_ERROR", ""),
}

CRITICAL_ACTIONS = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "CONTACT_SUPPORT",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
    }
)
WARNING_ACTIONS = frozenset({"IGNORE", "XID_154"})

# No action in the catalog yet: judged by name. Fatal timeouts, halts and uncorrectable memory errors
# need the GPU reset like their catalogued cousins (158 GPU_FATAL_TIMEOUT, 62 PMU_HALT_ERROR, 48 DBE).
_NO_ACTION_SEVERITY: dict[int, str] = {
    162: "warning",
    163: "warning",
    164: "warning",
    165: "warning",
    166: "error",
    167: "critical",
    168: "warning",
    169: "critical",
    170: "error",
    171: "critical",
    172: "critical",
}

# Codes the service acts on at once (ml/xid.py's overrides) where the catalog says RESTART_APP: 94, a contained
# ECC error, whose GPU the service resets. 63 (a row marked for remapping, catalog IGNORE) asks for nothing.
# tests/agents/test_xid_parity.py keeps this set and ml/xid.py in step (the agent cannot import ml/).
_RAISED_TO_CRITICAL = frozenset({94})

CRITICAL_XIDS: frozenset[int] = frozenset(
    code
    for code, (_, action) in XID_CATALOG.items()
    if action in CRITICAL_ACTIONS or _NO_ACTION_SEVERITY.get(code) == "critical" or code in _RAISED_TO_CRITICAL
)


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    mnemonic: str | None
    action: str | None
    severity: str  # "warning", "error" or "critical"

    @property
    def critical(self) -> bool:
        return self.severity == "critical"


def lookup(code: int) -> XidInfo:
    """What the agent knows about an Xid; unknown codes are errors (worth a look, not an emergency)."""
    entry = XID_CATALOG.get(code)
    if entry is None:
        return XidInfo(code, None, None, "error")
    mnemonic, action = entry
    if code in _RAISED_TO_CRITICAL:
        return XidInfo(code, mnemonic, action or None, "critical")
    if not action:
        return XidInfo(code, mnemonic, None, _NO_ACTION_SEVERITY.get(code, "error"))
    if action in CRITICAL_ACTIONS:
        severity = "critical"
    elif action in WARNING_ACTIONS:
        severity = "warning"
    else:
        severity = "error"
    return XidInfo(code, mnemonic, action, severity)
