"""NVLink domains (GB200 NVL72 and alike): is a domain's fabric failing as a whole, or one tray of it?

Pure: per compute tray, its GPUs' fabric info (NVML's, as the agent reports it), its fabric manager's state where it
runs one, and its recent NVLink findings (Xid 74, SXid, NVLink error counters, NVLS failures) in; a verdict out.

- `domain`: the switch side failed. The fabric manager is degraded (stopped on a tray that runs it, or the global
  fabric manager disconnected from most of the domain's trays), or at least `min_trays` trays show fabric trouble
  within the window: every tray's NVLink traffic crosses the same NVSwitch trays, so trouble on several trays at
  once is the switches', and the right decision drains the domain, not 18 trays one by one.
- `tray`: exactly one tray shows it: that tray's own GPUs or links; it is taken out alone (the per-node eviction).
- `none`: nothing wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Level = Literal["domain", "tray", "none"]


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's fabric info, as stored (service/models/nodes.py `Gpu.fabric_*`)."""

    index: int
    cluster_uuid: str | None
    clique_id: int | None = None
    state: str | None = None  # not_started, in_progress, completed
    status: int | None = None  # an NVML return code: 0 once registered
    health: str | None = None  # healthy, unhealthy, limited_capacity
    degraded_bw: bool | None = None
    gfm: str | None = None  # connected, disconnected


@dataclass(frozen=True, slots=True)
class Tray:
    """A compute tray (a node) of a domain."""

    node: str
    gpus: Sequence[GpuFabric] = ()
    fabric_manager: str | None = None  # running, stopped (a host that runs its own)
    nvlink_findings: int = 0  # recent NVLink findings about the node


@dataclass(slots=True)
class Verdict:
    level: Level
    troubled: dict[str, list[str]] = field(default_factory=dict)  # tray -> what is wrong with it
    switch_side: list[str] = field(default_factory=list)  # why the domain's fabric is blamed
    summary: str = ""


def gpu_trouble(gpu: GpuFabric) -> list[str]:
    """What a GPU's own fabric info says is wrong (empty: nothing it can tell)."""
    out = []
    if gpu.state is not None and gpu.state != "completed":
        out.append(f"GPU {gpu.index} fabric registration {gpu.state}")
    elif gpu.status not in (None, 0):
        out.append(f"GPU {gpu.index} fabric status {gpu.status}")
    if gpu.health in ("unhealthy", "limited_capacity"):
        out.append(f"GPU {gpu.index} fabric {gpu.health}")
    if gpu.degraded_bw:
        out.append(f"GPU {gpu.index} NVLink bandwidth degraded")
    return out


def tray_trouble(tray: Tray) -> list[str]:
    """What is wrong with a tray's fabric: its GPUs' fabric info, its fabric manager, its NVLink findings."""
    out = [reason for gpu in tray.gpus for reason in gpu_trouble(gpu)]
    if tray.fabric_manager == "stopped":
        out.append("fabric manager stopped")
    if any(gpu.gfm == "disconnected" for gpu in tray.gpus):
        out.append("global fabric manager disconnected")
    if tray.nvlink_findings:
        out.append(f"{tray.nvlink_findings} NVLink finding(s)")
    return out


def usable(tray: Tray) -> bool:
    """Whether the tray's GPUs are all registered in the fabric with nothing wrong."""
    return bool(tray.gpus) and not tray_trouble(tray)


def judge(trays: Sequence[Tray], *, min_trays: int = 2) -> Verdict:
    """The domain's verdict from its trays (see the module's docstring)."""
    troubled = {t.node: reasons for t in trays if (reasons := tray_trouble(t))}
    switch_side: list[str] = []
    stopped = sorted(t.node for t in trays if t.fabric_manager == "stopped")
    if stopped:
        switch_side.append(f"fabric manager stopped on {', '.join(stopped)}")
    reporting = [t for t in trays if any(g.gfm is not None for g in t.gpus)]
    cut_off = [t.node for t in reporting if any(g.gfm == "disconnected" for g in t.gpus)]
    if len(cut_off) >= 2 and len(cut_off) * 2 > len(reporting):
        switch_side.append(f"global fabric manager disconnected from {len(cut_off)} of {len(reporting)} trays")
    if len(troubled) >= min_trays:
        switch_side.append(f"fabric trouble on {len(troubled)} of {len(trays)} trays at once")
    if switch_side:
        return Verdict("domain", troubled, switch_side, "NVLink domain fabric failing: " + "; ".join(switch_side))
    if troubled:
        (node, reasons), *_ = troubled.items()
        return Verdict("tray", troubled, [], f"one tray's NVLink fabric failing: {node}: {'; '.join(reasons)}")
    return Verdict("none")


def cliques(trays: Sequence[Tray]) -> Mapping[int, list[str]]:
    """Clique id -> the trays whose GPUs are in it, in tray order."""
    out: dict[int, list[str]] = {}
    for tray in trays:
        for clique in sorted({g.clique_id for g in tray.gpus if g.clique_id is not None}):
            out.setdefault(clique, []).append(tray.node)
    return out
