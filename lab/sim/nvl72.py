"""A GB200 NVL72-like rack: the simulated cluster's nodes as compute trays of one NVLink domain.

18 compute trays x 4 GPUs share one NVLink domain through 9 NVSwitch trays (2 NVSwitch chips each); every GPU has
18 NVLink5 links, 2 to each switch tray. The fabric manager (the global one, on the switch trays) registers every
GPU into the domain's fabric cluster and clique; when a switch tray fails it routes around it and the domain runs
on, degraded: every GPU has lost 2 of its 18 links, its fabric info says degraded bandwidth, limited capacity.

What a tray's agent sees of this (the same as on a real GB200 tray, read by the agent's own code):
- NVML (`fake_nvml`: the fake pynvml of lab/fakes/nvml.py): each GPU's fabric info (cluster UUID, clique, state,
  health), its NVLink link states and error counters; in a live run, the fabric info through the node's fake NVML
  (lab/sim/fakegpu), fed from `fabric` by the runner (lab/sim/gpuanswers.py `machine_inventory`);
- its kernel log: NVLink5 Xid lines (144-150, lab/sim/logformat.py) for its GPUs' links;
and on the switch trays, their NVSwitch driver's SXid lines (`switch_lines`; the compute trays' agents do not see
them: a switch tray runs NVOS, with its own logs).
The faults that change it (`nvswitch_tray_failure`, `nvl72_tray_nvlink`) are in lab/sim/nvl72_faults.py.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import pynvml as real

from lab.fakes.nvml import FakeFabric, FakeGpu, FakeNvml
from lab.sim import logformat as fmt

COMPUTE_TRAYS = 18
GPUS_PER_TRAY = 4
SWITCH_TRAYS = 9
SWITCH_CHIPS_PER_TRAY = 2
LINKS_PER_GPU = 18  # NVLink5 on B200: 2 to each switch tray
LINKS_PER_SWITCH_TRAY = LINKS_PER_GPU // SWITCH_TRAYS
CLIQUE_ID = 32766  # one clique: every GPU of the domain reaches every other (no partitions)
GPU_NAME = "NVIDIA GB200"
# NVML_NVLINK_ERROR_DL_RECOVERY: what a link to a failed switch tray counts before it goes down.
RECOVERY_ERRORS_ON_FAILURE = 24


def domain_uuid(rack: str) -> str:
    """The rack's fabric cluster UUID: fixed by its name, as the fabric manager keeps it across restarts."""
    return str(uuid.UUID(bytes=hashlib.sha256(f"nvl72:{rack}".encode()).digest()[:16]))


@dataclass
class GpuFabricState:
    links_down: set[int] = field(default_factory=set)
    recovery_errors: dict[int, int] = field(default_factory=dict)  # link -> NVLink recovery errors
    unhealthy: bool = False  # the GPU's own links failed: the driver's health summary says unhealthy


@dataclass
class Nvl72Domain:
    """One NVLink domain's fabric state, for `trays` compute trays (the cluster's nodes, in order)."""

    rack: str
    trays: int
    cluster_uuid: str = ""
    switch_up: list[bool] = field(default_factory=lambda: [True] * SWITCH_TRAYS)
    manager: str = "running"  # the global fabric manager: running, degraded (routing around a lost switch tray)
    gpus: list[list[GpuFabricState]] = field(default_factory=list)
    switch_log: list[tuple[int, str]] = field(default_factory=list)  # (switch tray, kernel message)

    def __post_init__(self) -> None:
        if not 1 <= self.trays <= COMPUTE_TRAYS:
            raise ValueError(f"an NVL72 domain has 1 to {COMPUTE_TRAYS} compute trays, not {self.trays}")
        self.cluster_uuid = self.cluster_uuid or domain_uuid(self.rack)
        self.gpus = [[GpuFabricState() for _ in range(GPUS_PER_TRAY)] for _ in range(self.trays)]

    def switch_tray_name(self, index: int) -> str:
        return f"{self.rack}-switch{index + 1}"

    # --- what changes it (lab/sim/nvl72_faults.py) ---

    def fail_switch_tray(self, index: int) -> list[int]:
        """Switch tray `index` is lost: every GPU loses its links to it; the fabric manager routes around it.
        Returns the links each GPU lost."""
        self.switch_up[index] = False
        self.manager = "degraded"
        links = switch_links(index)
        for tray in self.gpus:
            for gpu in tray:
                for link in links:
                    gpu.links_down.add(link)
                    gpu.recovery_errors[link] = gpu.recovery_errors.get(link, 0) + RECOVERY_ERRORS_ON_FAILURE
        for chip in range(SWITCH_CHIPS_PER_TRAY):
            self.switch_log.append((index, fmt.sxid(chip, 20034, fatal=True, link=32 + chip, text="LTSSM Fault Up")))
        return links

    def fail_gpu_links(self, tray: int, gpu: int, links: list[int]) -> None:
        """One GPU's own links fail (its cable cartridge, its NVLink PHY): that GPU only."""
        state = self.gpus[tray][gpu]
        state.unhealthy = True
        for link in links:
            state.links_down.add(link)
            state.recovery_errors[link] = state.recovery_errors.get(link, 0) + RECOVERY_ERRORS_ON_FAILURE

    def repair(self) -> None:
        """Switch trays replaced, links reseated: the fabric as it was."""
        self.switch_up = [True] * SWITCH_TRAYS
        self.manager = "running"
        self.gpus = [[GpuFabricState() for _ in range(GPUS_PER_TRAY)] for _ in range(self.trays)]

    # --- what the agents read ---

    def fabric(self, tray: int, gpu: int) -> FakeFabric:
        """The GPU's fabric info as NVML answers it now."""
        state = self.gpus[tray][gpu]
        degraded = bool(state.links_down)
        summary = real.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        if state.unhealthy:
            summary = real.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
        elif degraded:
            summary = real.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
        return FakeFabric(
            cluster_uuid=self.cluster_uuid,
            clique_id=CLIQUE_ID,
            degraded_bw=degraded,
            gfm_connected=True,  # degraded, the global fabric manager still manages the domain
            summary=summary,
        )

    def fake_nvml(self, tray: int, identities: Sequence[tuple[int, str]]) -> FakeNvml:
        """The tray's NVML: its 4 GPUs (`identities`: each one's PCI bus and UUID, as the kernel log names them) with
        their fabric info, link states and NVLink error counters."""
        nvml = FakeNvml(len(identities))
        gpus = []
        for index, (bus, gpu_uuid) in enumerate(identities):
            state = self.gpus[tray][index]
            errors = {(link, real.NVML_NVLINK_ERROR_DL_RECOVERY): n for link, n in state.recovery_errors.items()}
            gpus.append(
                FakeGpu(
                    index,
                    name=GPU_NAME,
                    bus=bus,
                    uuid=gpu_uuid,
                    nvlinks=[0 if link in state.links_down else 1 for link in range(LINKS_PER_GPU)],
                    nvlink_errors=errors,
                    fabric=self.fabric(tray, index),
                )
            )
        nvml.set_gpus(gpus)
        return nvml

    def switch_lines(self) -> list[tuple[str, str]]:
        """(switch tray name, kernel message) for the SXids the switch trays logged."""
        return [(self.switch_tray_name(i), msg) for i, msg in self.switch_log]


def switch_links(index: int) -> list[int]:
    """A GPU's links to switch tray `index`."""
    return list(range(index * LINKS_PER_SWITCH_TRAY, (index + 1) * LINKS_PER_SWITCH_TRAY))
