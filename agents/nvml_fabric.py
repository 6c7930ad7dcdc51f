"""A GPU's NVLink fabric through NVML: which NVLink domain (fabric cluster) and clique it belongs to, and how its
registration with the fabric manager went.

On GB200 NVL72 and other multi-node NVLink systems, `nvmlDeviceGetGpuFabricInfoV` answers per GPU: the fabric
cluster's UUID (one per NVLink domain: the 72 GPUs of a rack), the clique id (the GPUs that can talk over
NVLink within it), the state of the GPU's registration (not started, in progress, completed), its status (an
NVML return code: 0 once registered) and, from driver 550 on, a health mask that says whether the fabric runs
with degraded bandwidth and whether the global fabric manager (GFM, on the switch trays) is still connected.
An HGX board with local NVSwitches, a PCIe card or an older driver answers NotSupported or FunctionNotFound:
nothing is reported for it, and it is never asked again.

Reported as (the heartbeat's `gpus[].fabric`, docs/wire.md):
    {"cluster_uuid": "...", "clique_id": 32766, "state": "completed", "status": 0,
     "health": "healthy" | "unhealthy" | "limited_capacity" | None, "degraded_bw": bool | None,
     "gfm": "connected" | "disconnected" | None}
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

log = logging.getLogger(__name__)

STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
HEALTH = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}  # 0: the driver does not say
_DEGRADED_BW_SHIFT, _GFM_SHIFT, _FIELD = 0, 14, 0x3  # NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_*
_TRUE, _FALSE = 1, 2  # NVML_GPU_FABRIC_HEALTH_MASK_*_TRUE / _FALSE (and GFM_STATE_CONNECTED / _DISCONNECTED)


class FabricReader:
    """Reads one GPU's fabric info with the newest call and structure the driver answers, falling back in order:
    `nvmlDeviceGetGpuFabricInfoV` with the v3 structure (health summary), with v2 (health mask), then the
    deprecated `nvmlDeviceGetGpuFabricInfo` (no health). `supported` turns False for good once none answers."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.supported = True
        self._error = nv.NVMLError
        self._absent = tuple(
            getattr(nv, name) for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound") if hasattr(nv, name)
        )
        # A structure version the driver does not know is answered ArgumentVersionMismatch: try the older one.
        self._mismatch = tuple(
            getattr(nv, name) for name in ("NVMLError_ArgumentVersionMismatch",) if hasattr(nv, name)
        )
        self._ways = [
            way
            for way in (
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
                ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
            )
            if hasattr(nv, way[0]) and hasattr(nv, way[1])
        ]
        if not self._ways:
            self.supported = False

    def read(self, handle: Any) -> dict[str, Any] | None:
        """The GPU's fabric, or None when it has none (and then `supported` is False) or NVML failed this time."""
        while self._ways:
            call, struct = self._ways[0]
            info = getattr(self.nv, struct)()
            try:
                getattr(self.nv, call)(handle, info)
            except self._absent + self._mismatch as exc:
                log.debug("GPU fabric info: %s with %s answers %s", call, struct, exc)
                self._ways.pop(0)
                continue
            except self._error as exc:
                log.debug("GPU fabric info unreadable now: %s", exc)
                return None
            return fabric_dict(info)
        self.supported = False
        return None


def fabric_dict(info: Any) -> dict[str, Any] | None:
    """The wire form of one fabric info structure; None for a GPU that is in no NVLink fabric."""
    state = STATES.get(int(info.state), str(int(info.state)))
    if state == "not_supported":
        return None
    raw = bytes(info.clusterUuid)
    out: dict[str, Any] = {
        # All zeros before the GPU registered: no cluster yet, which the state says.
        "cluster_uuid": str(uuid.UUID(bytes=raw)) if any(raw) else None,
        "clique_id": int(info.cliqueId),
        "state": state,
        "status": int(info.status),
        "health": None,
        "degraded_bw": None,
        "gfm": None,
    }
    mask = getattr(info, "healthMask", None)
    if mask is not None:
        bw = (int(mask) >> _DEGRADED_BW_SHIFT) & _FIELD
        gfm = (int(mask) >> _GFM_SHIFT) & _FIELD
        out["degraded_bw"] = True if bw == _TRUE else False if bw == _FALSE else None
        out["gfm"] = "connected" if gfm == _TRUE else "disconnected" if gfm == _FALSE else None
    summary = getattr(info, "healthSummary", None)
    if summary is not None:
        out["health"] = HEALTH.get(int(summary))
    return out
