"""The faults of an NVL72 rack's NVLink fabric, mixed into the cluster (lab/sim/model.py) on top of FaultInjection
(lab/sim/faults.py); the fabric's state is lab/sim/nvl72.py's.

- `nvswitch_tray_failure`: one of the 9 NVSwitch trays is lost. Every GPU of the domain loses its 2 links to it and
  logs a fatal NVLink5 Xid for them; the fabric manager routes around it (degraded), the GPUs' fabric info says
  degraded bandwidth, the switch tray's own log has fatal SXids; the job runs on, its all-reduce slower. The fault
  is the domain's: drain it (cordon its trays), evict none of them.
- `nvl72_tray_nvlink`: one GPU's own links fail (a cable cartridge): fatal NVLink5 Xids on that GPU only, its
  fabric health unhealthy, the job slower. The fault is that tray's: evict it, leave the domain alone.
"""

from __future__ import annotations

from lab.sim import logformat as fmt
from lab.sim.faults import FaultInjection, FaultRecord
from lab.sim.gpu_faults import NVLINK_COMM_FACTOR
from lab.sim.nvl72 import LINKS_PER_GPU, SWITCH_TRAYS, Nvl72Domain
from lab.sim.scenarios import FaultSpec

# The first word of a NETIR_LINK_EVT Xid 149's interrupt info: a link that went down (tests/fixtures/logs/
# xid149_xid145_nvlink5_gb200_gpud_1174.txt has 0x025001c6 for "Link 00").
_LINK_DOWN_INFO = 0x025001C6
_TRAY_LINKS_LOST = 4  # a cable cartridge: 4 of the GPU's 18 links


class Nvl72Faults(FaultInjection):
    """Cluster's NVLink-domain faults (lab/sim/model.py mixes this in); `nvl72` is the cluster's domain."""

    nvl72: Nvl72Domain | None

    def _domain(self, kind: str) -> Nvl72Domain:
        if self.nvl72 is None:
            raise ValueError(f"{kind} needs an NVL72 rack (SimConfig.nvl72)")
        return self.nvl72

    def _inject_nvswitch_tray_failure(self, spec: FaultSpec, record: FaultRecord) -> None:
        domain = self._domain(spec.kind)
        index = self.rng.randrange(SWITCH_TRAYS)
        links = domain.fail_switch_tray(index)
        record.details = {
            "switch_tray": domain.switch_tray_name(index),
            "nvlink_domain": domain.cluster_uuid,
            "links": links,
            "trays": [self.node_names[n] for n in range(domain.trays)],
        }
        for n in range(domain.trays):
            for gpu in self.gpus[n]:
                for link in links:
                    line = fmt.nvlink5_xid(gpu.bus, 149, "NETIR_LINK_EVT", fatal=True, link=link, info=_LINK_DOWN_INFO)
                    self._kern(n, line)
        # NCCL runs on over the other 16 links: the all-reduce takes 18/16 as long.
        self.job.comm_factor = LINKS_PER_GPU / (LINKS_PER_GPU - len(links))
        self._plan_step()

    def _inject_nvl72_tray_nvlink(self, spec: FaultSpec, record: FaultRecord) -> None:
        domain = self._domain(spec.kind)
        n, g = spec.node, spec.gpu
        assert n is not None and g is not None
        first = self.rng.randrange(LINKS_PER_GPU - _TRAY_LINKS_LOST)
        links = list(range(first, first + _TRAY_LINKS_LOST))
        domain.fail_gpu_links(n, g, links)
        record.details = {"nvlink_domain": domain.cluster_uuid, "links": links}
        gpu = self.gpus[n][g]
        gpu.nvlink_bad = True
        for link in links:
            self._kern(n, fmt.nvlink5_xid(gpu.bus, 149, "NETIR_LINK_EVT", fatal=True, link=link, info=_LINK_DOWN_INFO))
        self.job.comm_factor = NVLINK_COMM_FACTOR
        self._plan_step()
