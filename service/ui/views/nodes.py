"""Nodes: the filtered list, and one node's state, GPUs with their counters, logs, incidents and history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.incidents import service as incidents
from service.nodes import lifecycle
from service.nodes import service as nodes
from service.nodes.schemas import NodeDetail

# A GPU's counters older than this are not "recent": an agent that stopped reporting shows blanks, not stale values.
COUNTERS_WINDOW_S = 600.0
LOG_LIMIT = 50
# Progress lines come every few seconds from every rank: they would push an Xid off the page within a minute.
# Bounded in time so a node with nothing but progress lines does not scan its whole history.
LOG_SKIP_KINDS = ("step",)
LOG_WINDOW = timedelta(hours=24)
INCIDENT_LIMIT = 50
# Which manual transitions the node's state allows: the forms shown are the ones that can succeed.
ACTIONS_FROM: dict[str, tuple[str, ...]] = {
    "cordon": lifecycle.CORDON_FROM,
    "repair": lifecycle.REPAIR_FROM,
    "return": lifecycle.RETURN_FROM,
}
# The columns of metric_samples the GPU table shows (see ml/metrics.py for where each comes from).
_COUNTER_COLUMNS = (
    "gpu_util",
    "sm_active",
    "tensor_active",
    "power_usage",
    "power_limit",
    "gpu_temp",
    "memory_temp",
    "fb_used",
    "fb_free",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "row_remap_failure",
    "xid_last",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "pcie_replay",
    "pcie_link_gen",
    "pcie_link_width",
    "pcie_max_link_gen",
    "pcie_max_link_width",
    "row_remap_pending",
)
_NVLINK_ERRORS = ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors")
_XID_KINDS = ("xid", "sxid")


@dataclass(frozen=True)
class Cell:
    """One formatted counter: its text, `bad`/`warn` when it says something is wrong, a tooltip."""

    text: str
    level: str | None = None
    title: str | None = None


@dataclass
class GpuCounters:
    index: int
    uuid: str | None
    model: str | None
    pci_bus_id: str | None
    sampled_at: datetime | None
    values: dict[str, float | None]

    @property
    def cells(self) -> list[Cell]:
        return [spec(self.values) for _, spec in COUNTER_CELLS]


@dataclass
class LogLine:
    id: int
    ts: datetime
    kind: str
    source: str
    severity: str | None
    rank: int | None
    line: str
    job_id: str | None
    xid: int | None
    meaning: str | None

    @property
    def highlight(self) -> bool:
        return self.kind in _XID_KINDS or self.xid is not None

    @property
    def first_line(self) -> str:
        return self.line.split("\n", 1)[0]

    @property
    def rest(self) -> str:
        """What follows the first line (a traceback, the rest of a multi-line kernel message)."""
        return self.line.split("\n", 1)[1] if "\n" in self.line else ""


@dataclass
class NodeIncident:
    id: int
    job_id: str
    state: str
    severity: str
    root_cause: str
    blame: str
    summary: str | None
    suspect_confidence: float | None  # None: the node is in its findings but not among its suspects
    opened_at: datetime
    resolved_at: datetime | None
    resolution: str | None
    # The machines it is about (its anchor and suspects): the page names their GPUs in the summary by index.
    named: list[str] = field(default_factory=list)


@dataclass
class NodeView:
    node: NodeDetail
    gpus: list[GpuCounters]
    logs: list[LogLine]
    incidents: list[NodeIncident]
    actions: list[str]
    quarantined: bool
    counters_window_s: float


def _num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None, *, ratio: bool) -> Cell:
    if value is None:
        return Cell("")
    return Cell(f"{value * 100 if ratio else value:.0f}%")


def _pair(a: float | None, b: float | None, unit: str, digits: int = 0) -> str:
    if a is None and b is None:
        return ""
    return f"{_num(a, digits) or '?'} / {_num(b, digits) or '?'}{unit}"


def _errors(*values: float | None, level: str = "bad", title: str | None = None) -> Cell:
    """Counters that should stay at zero: blank when unknown, highlighted when any is above zero."""
    if all(v is None for v in values):
        return Cell("")
    text = " / ".join(_num(v) if v is not None else "?" for v in values)
    return Cell(text, level if any((v or 0) > 0 for v in values) else None, title)


def _remapped_rows(v: dict[str, float | None]) -> Cell:
    """Rows remapped for correctable errors are the memory's normal upkeep (the GPU swaps a weak row for a spare
    and runs on): neutral. Uncorrectable remaps and a failed remap (no spare row left) are the alarming ones."""
    correctable, uncorrectable, failed = (
        v["remapped_rows_correctable"],
        v["remapped_rows_uncorrectable"],
        v["row_remap_failure"],
    )
    cell = _errors(uncorrectable, failed)
    if all(x is None for x in (correctable, uncorrectable, failed)):
        return Cell("")
    text = " / ".join(_num(x) if x is not None else "?" for x in (correctable, uncorrectable, failed))
    title = "correctable (normal upkeep) / uncorrectable / remap failure"
    return Cell(text, cell.level, title)


def _memory(v: dict[str, float | None]) -> Cell:
    used, free = v["fb_used"], v["fb_free"]
    if used is None:
        return Cell("")
    total = used + free if free is not None else None
    text = f"{used / 1024:.1f} / {total / 1024:.1f} GiB" if total else f"{used / 1024:.1f} GiB"
    return Cell(text, title=f"{used:.0f} MiB used, {_num(free) or '?'} MiB free")


def _temperature(v: dict[str, float | None]) -> Cell:
    hot = (v["gpu_temp"] or 0) >= 87 or (v["memory_temp"] or 0) >= 95
    return Cell(_pair(v["gpu_temp"], v["memory_temp"], " °C"), "warn" if hot else None, "GPU / memory temperature")


def _nvlink(v: dict[str, float | None]) -> Cell:
    values = [v[c] for c in _NVLINK_ERRORS]
    if all(x is None for x in values):
        return Cell("")
    total = sum(x or 0 for x in values)
    title = ", ".join(f"{c.removeprefix('nvlink_').replace('_', ' ')} {_num(v[c]) or '?'}" for c in _NVLINK_ERRORS)
    return Cell(_num(total), "bad" if total > 0 else None, title)


def _pcie_link(v: dict[str, float | None]) -> Cell:
    gen, width = v["pcie_link_gen"], v["pcie_link_width"]
    if gen is None and width is None:
        return Cell("")
    top_gen, top_width = v["pcie_max_link_gen"], v["pcie_max_link_width"]
    narrow = width is not None and top_width is not None and width < top_width
    slower = gen is not None and top_gen is not None and gen < top_gen
    title = f"max gen {_num(top_gen) or '?'} x{_num(top_width) or '?'} (an idle GPU may lower its generation)"
    return Cell(f"gen {_num(gen) or '?'} x{_num(width) or '?'}", "bad" if narrow else "warn" if slower else None, title)


# (header, formatter): the GPU table's counter columns, in order.
COUNTER_CELLS: tuple[tuple[str, Callable[[dict[str, float | None]], Cell]], ...] = (
    ("util %", lambda v: _pct(v["gpu_util"], ratio=False)),
    ("SM active %", lambda v: _pct(v["sm_active"], ratio=True)),
    ("tensor active %", lambda v: _pct(v["tensor_active"], ratio=True)),
    ("power W (used / limit)", lambda v: Cell(_pair(v["power_usage"], v["power_limit"], " W"), title="usage / limit")),
    ("temp °C (GPU / memory)", _temperature),
    ("memory GiB (used / total)", _memory),
    (
        "ECC errors (single / double bit)",
        lambda v: _errors(v["ecc_sbe_volatile"], v["ecc_dbe_volatile"], title="volatile single / double-bit errors"),
    ),
    ("remapped rows (correctable / uncorrectable / failed)", _remapped_rows),
    ("last Xid", lambda v: _errors(v["xid_last"], title="DCGM_FI_DEV_XID_ERRORS: the last Xid seen")),
    ("NVLink errors", _nvlink),
    ("PCIe replays", lambda v: _errors(v["pcie_replay"], level="warn", title="cumulative PCIe replay counter")),
    ("PCIe link", _pcie_link),
    ("remap pending", lambda v: _errors(v["row_remap_pending"], level="warn", title="rows waiting for a GPU reset")),
)


def gpu_counters(session: Session, *, name: str, now: datetime, window_s: float) -> dict[int, GpuCounters]:
    """The latest sample of each of the node's GPUs within the window: one DISTINCT ON query."""
    rows = nodes.latest_gpu_samples(
        session, name=name, since=now - timedelta(seconds=window_s), columns=_COUNTER_COLUMNS
    )
    return {
        row.gpu: GpuCounters(
            index=row.gpu,
            uuid=None,
            model=None,
            pci_bus_id=None,
            sampled_at=row.ts,
            values={c: getattr(row, c) for c in _COUNTER_COLUMNS},
        )
        for row in rows
    }


def _gpus(detail: NodeDetail, counters: dict[int, GpuCounters]) -> list[GpuCounters]:
    """Every GPU the node registered, and any that only its samples mention, with their counters or blanks."""
    out: dict[int, GpuCounters] = {}
    for g in detail.gpu_list:
        sample = counters.get(g.index)
        out[g.index] = GpuCounters(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            pci_bus_id=g.pci_bus_id,
            sampled_at=sample.sampled_at if sample else None,
            values=sample.values if sample else dict.fromkeys(_COUNTER_COLUMNS),
        )
    for index, sample in counters.items():
        out.setdefault(index, sample)
    return [out[i] for i in sorted(out)]


def recent_logs(session: Session, *, name: str, now: datetime, limit: int = LOG_LIMIT) -> list[LogLine]:
    """The node's newest log events of the last day, Xid lines among them, progress lines left out."""
    rows = nodes.log_events(
        session,
        name=name,
        since=now - LOG_WINDOW,
        # Not past tomorrow: a row stored before ingest refused such times must not break the page.
        until=now + LOG_WINDOW,
        skip_kinds=LOG_SKIP_KINDS,
        limit=limit,
    )
    out = []
    for e, job in rows:
        fields: dict[str, Any] = e.fields or {}
        code = fields.get("xid", fields.get("sxid"))
        out.append(
            LogLine(
                id=e.id,
                ts=e.ts,
                kind=e.kind,
                source=e.source,
                severity=e.severity,
                rank=e.rank,
                line=e.line,
                job_id=job,
                xid=code if isinstance(code, int) else None,
                meaning=fields.get("mnemonic") or fields.get("action"),
            )
        )
    return out


def incidents_of(session: Session, *, name: str, limit: int = INCIDENT_LIMIT) -> list[NodeIncident]:
    """Incidents, open or not, that name the node as a suspect or in a finding: newest first, one query."""
    rows = incidents.naming_node(session, name=name, limit=limit)
    return [
        NodeIncident(
            id=i.id,
            job_id=job,
            state=i.state,
            severity=i.severity,
            root_cause=i.root_cause,
            blame=i.blame,
            summary=i.summary,
            suspect_confidence=next(
                (float(s.get("confidence") or 0.0) for s in i.suspects or [] if s.get("node") == name), None
            ),
            opened_at=i.opened_at,
            resolved_at=i.resolved_at,
            resolution=i.resolution,
            named=[n for n in (i.anchor, *(s.get("node") for s in i.suspects or [])) if n],
        )
        for i, job in rows
    ]


def node_view(session: Session, *, name: str, now: datetime, window_s: float = COUNTERS_WINDOW_S) -> NodeView:
    """Everything the node page shows, in a fixed number of queries (NotFound for an unknown node)."""
    detail = nodes.describe(session, name=name)
    return NodeView(
        node=detail,
        gpus=_gpus(detail, gpu_counters(session, name=name, now=now, window_s=window_s)),
        logs=recent_logs(session, name=name, now=now),
        incidents=incidents_of(session, name=name),
        actions=[action for action, allowed in ACTIONS_FROM.items() if detail.state in allowed],
        quarantined=detail.quarantined_until is not None and detail.quarantined_until > now,
        counters_window_s=window_s,
    )
