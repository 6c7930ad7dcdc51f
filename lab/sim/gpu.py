"""One simulated H100: how a training phase turns into DCGM readings.

Activity (computing, waiting for peers, all-reducing, spinning in a hung collective, idle, no process)
sets targets; gauges follow them smoothly (DCGM averages over its sampling window), power follows
activity and clocks, temperature follows power, counters integrate. Fault flags (lost, thermal, bad
NVLink, flaky PCIe) bend the physics; the model decides when they are set.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass

from lab.sim import dcgm_fields as F

TICK = 0.1  # simulated seconds per model step; a training step spans ~10 ticks
COMPUTE_SHARE = 0.72  # of a healthy step spent in forward/backward, the rest in the gradient all-reduce
THROTTLE_RATIO = 0.68  # SM clock of a thermally throttled GPU relative to max boost
IDLE_W, PEAK_W = 68.0, 700.0

# Activities a GPU can be in, and the DCGM activity they produce:
# (gr_engine, sm_active, sm_occupancy, tensor, dram, gpu_util %, mem_copy_util %, nvlink B/s, pcie B/s, power 0..1)
COMPUTE, WAIT, COMM, SPIN, IDLE, NONE = "compute", "wait", "comm", "spin", "idle", "none"
SAVE = "save"  # saving a checkpoint: the GPU copies its state to the host (PCIe busy), computes nothing
TARGETS: dict[str, tuple[float, ...]] = {
    COMPUTE: (0.97, 0.86, 0.42, 0.58, 0.48, 100, 45, 12e9, 1.5e9, 0.90),
    WAIT: (0.93, 0.06, 0.02, 0.0, 0.03, 100, 2, 2e9, 0.3e9, 0.25),
    COMM: (0.95, 0.30, 0.10, 0.0, 0.35, 100, 30, 330e9, 42e9, 0.50),
    SPIN: (0.99, 0.04, 0.01, 0.0, 0.01, 100, 0, 0.0, 0.01e9, 0.17),  # NCCL kernel polling forever (a hang)
    IDLE: (0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0.0, 0.0, 0.04),  # process alive, GPU not used (stuck on the host)
    NONE: (0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0.0, 0.0, 0.0),  # no process
    SAVE: (0.06, 0.02, 0.01, 0.0, 0.06, 12, 18, 0.0, 9e9, 0.10),
}
BUSY = frozenset({COMPUTE, WAIT, COMM, SPIN, SAVE})


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    bus_id: str  # as dcgm-exporter labels it: 00000000:9D:00.0
    values: dict[str, float]


class Gpu:
    """One GPU: smoothed activity, thermal state, counters, fault flags, and the values last sampled."""

    def __init__(self, node: int, index: int, rng: random.Random) -> None:
        self.node = node
        self.index = index
        self.bus = F.PCI_BUSES[index % len(F.PCI_BUSES)] + 2 * (index // len(F.PCI_BUSES))
        self.uuid = "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.serial = str(1650000000000 + rng.randrange(10**9))
        # Silicon lottery and airflow: stable per-GPU differences peers comparison must tolerate.
        self.power_scale = 1.0 + rng.gauss(0, 0.025)
        self.temp_offset = rng.gauss(0, 2.0)
        self.ambient = 0.0  # the inlet air's drift from its mean (realism: over a simulated day)
        self.fb_base = 71200 + rng.randrange(-400, 400)
        # Start in training steady state (the job was running before the simulator started watching).
        compute, comm = TARGETS[COMPUTE], TARGETS[COMM]
        self.act = [c * COMPUTE_SHARE + m * (1 - COMPUTE_SHARE) for c, m in zip(compute, comm, strict=True)]
        self.temp = 26 + 0.062 * (IDLE_W + (PEAK_W - IDLE_W) * self.act[-1]) + self.temp_offset
        self.energy_mj = rng.randrange(10**10, 9 * 10**10)
        self.nvlink_kib = rng.randrange(10**11, 10**12)
        self.pcie_replay = rng.choice((0, 0, 0, 0, 0, 1, 2))
        self.sbe_vol = 0
        self.dbe_vol = 0
        self.sbe_agg = rng.choice((0, 0, 0, 0, 1, 3))
        self.dbe_agg = 0
        self.unc_remap = 0
        self.cor_remap = rng.choice((0, 0, 0, 0, 0, 0, 1))
        self.crc_flit = self.crc_data = self.nvl_replay = self.nvl_recovery = 0
        self.power_violation_ns = rng.randrange(10**12)
        self.thermal_violation_ns = 0
        self.xid = 0
        self.lost = False
        self.thermal = False
        self.nvlink_bad = False
        self.pcie_flaky = False
        self.pcie_gen, self.pcie_width = F.PCIE_MAX_GEN, F.PCIE_MAX_WIDTH  # as the link trained
        self.remap_pending = 0
        self.remap_failure = 0  # the row remapper found no spare row (HBM3): cleared by repair, not by a reset
        self.corrupting = False  # silent data corruption: wrong results, no error
        self.values: dict[str, float] = {}

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    def update(self, activity: str, nvlink_scale: float, rng: random.Random) -> None:
        a = 1.0 - math.exp(-TICK / 0.35)  # gauges are averages over DCGM's sampling window
        target = TARGETS[activity]
        act = self.act
        for i, v in enumerate(target):
            act[i] += a * (v - act[i])
        gr, sm, occ, tensor, dram, util, memutil, nvl, pcie, pfrac = act
        busy = activity in BUSY
        clock_ratio = THROTTLE_RATIO if self.thermal else 1.0

        power = IDLE_W + (PEAK_W - IDLE_W) * pfrac * self.power_scale * clock_ratio**1.5 + rng.gauss(0, 4.0)
        capped = power > F.POWER_LIMIT_W * 0.985
        if capped:
            power = F.POWER_LIMIT_W * 0.985 + rng.gauss(0, 1.5)
        power = max(power, IDLE_W * 0.9)
        # Failing cooling: the clocks throttle to hold the GPU at its slowdown temperature, whatever the power.
        target_temp = (
            87.0 + 0.3 * self.temp_offset if self.thermal else 26 + 0.062 * power + self.temp_offset + self.ambient
        )
        self.temp += (target_temp - self.temp) * (1.0 - math.exp(-TICK / (6.0 if self.thermal else 20.0)))

        if not busy:
            sm_clock = F.SM_CLOCK_IDLE_MHZ
        elif self.thermal:
            sm_clock = int(F.SM_CLOCK_MAX_MHZ * THROTTLE_RATIO + rng.gauss(0, 18))
        elif capped:
            sm_clock = F.SM_CLOCK_MAX_MHZ - 15 * rng.randrange(2, 8)
        else:
            sm_clock = F.SM_CLOCK_MAX_MHZ
        reasons = 0 if busy else F.CLOCKS_GPU_IDLE
        if capped:
            reasons |= F.CLOCKS_SW_POWER_CAP
            self.power_violation_ns += int(TICK * 1e9)
        if self.thermal:
            reasons |= F.CLOCKS_SW_THERMAL | F.CLOCKS_HW_THERMAL | F.CLOCKS_HW_SLOWDOWN
            self.thermal_violation_ns += int(TICK * 1e9)

        nvl *= nvlink_scale
        # A link trained below its maximum caps what the GPU can move over PCIe (~85% of the raw rate).
        pcie = min(pcie, 0.85e9 * F.PCIE_LANE_GBPS[self.pcie_gen] * self.pcie_width)
        self.energy_mj += int(power * TICK * 1000)
        self.nvlink_kib += int(2 * nvl * TICK / 1024)
        if self.nvlink_bad:
            self.crc_flit += _poisson(rng, 90 * TICK)
            self.crc_data += _poisson(rng, 6 * TICK)
            self.nvl_replay += _poisson(rng, 40 * TICK)
            self.nvl_recovery += _poisson(rng, 0.05 * TICK)
            nvl *= 0.8
        if self.pcie_flaky:
            self.pcie_replay += _poisson(rng, 30 * TICK)
        alive = activity != NONE
        fb_used = self.fb_base + (rng.randrange(-3, 4) if busy else 0) if alive else 0

        # Measurement noise: each GPU, each sample its own; exact zeros stay zero (an idle GPU reads 0).
        def ratio(x: float) -> float:
            return min(1.0, max(0.0, x * (1.0 + rng.gauss(0, 0.03)) + rng.gauss(0, 0.003))) if x > 1e-4 else 0.0

        def percent(x: float, sd: float) -> int:
            if x <= 0.5:
                return 0
            return 100 if x >= 99.5 else round(min(100.0, max(0.0, x + rng.gauss(0, sd))))

        def rate(x: float, sd: float, floor: int = 0) -> int:
            # PCIe never reads exactly 0: the driver's own traffic.
            return int(x * (1 + rng.gauss(0, sd))) if x > 1e5 else (rng.randrange(floor, 4 * floor) if floor else 0)

        self.values = {
            "DCGM_FI_DEV_SM_CLOCK": sm_clock,
            "DCGM_FI_DEV_MEM_CLOCK": F.MEM_CLOCK_MHZ,
            "DCGM_FI_DEV_MEMORY_TEMP": round(self.temp + 5.0 + rng.gauss(0, 0.4)),
            "DCGM_FI_DEV_GPU_TEMP": round(self.temp + rng.gauss(0, 0.4)),
            "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
            "DCGM_FI_DEV_POWER_MGMT_LIMIT": F.POWER_LIMIT_W,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy_mj,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": self.pcie_replay,
            "DCGM_FI_DEV_GPU_UTIL": percent(util, 1.0),
            "DCGM_FI_DEV_MEM_COPY_UTIL": percent(memutil, 1.5),
            "DCGM_FI_DEV_XID_ERRORS": self.xid,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": reasons,
            "DCGM_FI_DEV_POWER_VIOLATION": self.power_violation_ns,
            "DCGM_FI_DEV_THERMAL_VIOLATION": self.thermal_violation_ns,
            "DCGM_FI_DEV_FB_FREE": F.FB_TOTAL_MIB - F.FB_RESERVED_MIB - fb_used,
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_RESERVED": F.FB_RESERVED_MIB,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": self.sbe_vol,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": self.dbe_vol,
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": self.sbe_agg,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": self.dbe_agg,
            "DCGM_FI_DEV_RETIRED_SBE": F.INT64_NOT_SUPPORTED,
            "DCGM_FI_DEV_RETIRED_DBE": F.INT64_NOT_SUPPORTED,
            "DCGM_FI_DEV_RETIRED_PENDING": F.INT64_NOT_SUPPORTED,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": self.unc_remap,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": self.cor_remap,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": self.remap_failure,
            "DCGM_FI_DEV_ROW_REMAP_PENDING": self.remap_pending,
            "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": F.PCIE_MAX_GEN,
            "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": F.PCIE_MAX_WIDTH,
            "DCGM_FI_DEV_PCIE_LINK_GEN": self.pcie_gen,
            "DCGM_FI_DEV_PCIE_LINK_WIDTH": self.pcie_width,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": self.crc_flit,
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": self.crc_data,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": self.nvl_replay,
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": self.nvl_recovery,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": self.nvlink_kib,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ratio(gr),
            "DCGM_FI_PROF_SM_ACTIVE": ratio(sm),
            "DCGM_FI_PROF_SM_OCCUPANCY": ratio(occ),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ratio(tensor * clock_ratio**-0.1),
            "DCGM_FI_PROF_DRAM_ACTIVE": ratio(dram),
            "DCGM_FI_PROF_PCIE_TX_BYTES": rate(pcie, 0.05, floor=20000),
            "DCGM_FI_PROF_PCIE_RX_BYTES": rate(pcie, 0.05, floor=20000),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": rate(nvl, 0.04),
            "DCGM_FI_PROF_NVLINK_RX_BYTES": rate(nvl, 0.04),
        }

    def reset(self) -> None:
        """A GPU reset or node repair: faults cleared, volatile counters back to zero, pending remaps applied."""
        self.lost = self.thermal = self.nvlink_bad = self.pcie_flaky = self.corrupting = False
        self.pcie_gen, self.pcie_width = F.PCIE_MAX_GEN, F.PCIE_MAX_WIDTH
        self.remap_pending = 0
        self.xid = 0
        self.sbe_vol = self.dbe_vol = 0

    def repair(self) -> None:
        """The machine back from the repair shop: reset, and the memory whose rows ran out replaced."""
        self.reset()
        self.remap_failure = 0


def _poisson(rng: random.Random, lam: float) -> int:
    # Knuth's method; lam stays small (per-tick rates).
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
