"""A node's machine-level readings for its page: each network port, the host and its volumes, latest first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from ml.node_metrics import NODE_COLUMNS, PORT_ACTIVE, subject_kind
from service.nodes import service as nodes
from service.ui.views.nodes import Cell

# IB port states (sysfs `state`), by number.
_PORT_STATES = {1.0: "DOWN", 2.0: "INIT", 3.0: "ARMED", 4.0: "ACTIVE", 5.0: "ACTIVE_DEFER"}
_PORT_ERRORS = (
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)
_ETH_ERRORS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
_KIND_ORDER = {"host": 0, "ib": 1, "roce": 2, "eth": 3, "vol": 4}


@dataclass
class SubjectRow:
    subject: str
    sampled_at: datetime
    cells: list[tuple[str, Cell]]  # (label, value)


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}{unit}"


def _sum(values: dict[str, float | None], names: tuple[str, ...]) -> float | None:
    present = [values[n] for n in names if values.get(n) is not None]
    return sum(present) if present else None  # type: ignore[arg-type]


def _pair(a: float | None, b: float | None, unit: str = "", digits: int = 0) -> str:
    if a is None and b is None:
        return ""
    return f"{_num(a, unit, digits) or '?'} / {_num(b, unit, digits) or '?'}"


def _port(v: dict[str, float | None]) -> list[tuple[str, Cell]]:
    state = v.get("port_state")
    named = _PORT_STATES.get(state, _num(state)) if state is not None else ""
    downed = v.get("link_downed")
    errors = _sum(v, _PORT_ERRORS)
    error_title = ", ".join(f"{n.replace('_', ' ')} {_num(v.get(n)) or '?'}" for n in _PORT_ERRORS)
    return [
        ("state", Cell(named, "bad" if state is not None and state < PORT_ACTIVE else None)),
        ("rate", Cell(_num(v.get("port_rate_gbps"), " Gb/s"))),
        ("link downed", Cell(_num(downed), "warn" if downed else None, "times the link went down")),
        ("link errors", Cell(_num(errors), "warn" if errors else None, error_title)),
        ("xmit wait", Cell(_num(v.get("port_xmit_wait")), title="cumulative port_xmit_wait ticks")),
        ("pause rx / tx", Cell(_pair(v.get("pause_rx_frames"), v.get("pause_tx_frames")), title="pause frames")),
    ]


def _eth(v: dict[str, float | None]) -> list[tuple[str, Cell]]:
    errors = _sum(v, _ETH_ERRORS)
    title = ", ".join(f"{n.replace('_', ' ')} {_num(v.get(n)) or '?'}" for n in _ETH_ERRORS)
    return [("errors and drops", Cell(_num(errors), "warn" if errors else None, title))]


def _host(v: dict[str, float | None]) -> list[tuple[str, Cell]]:
    total, available = v.get("mem_total_mib"), v.get("mem_available_mib")
    low = total is not None and available is not None and total > 0 and available / total < 0.05
    memory = f"{_num(available / 1024, ' GiB', 1)} of {_num(total / 1024, ' GiB')}" if total and available else ""
    some, full = v.get("psi_mem_some_avg10"), v.get("psi_mem_full_avg10")
    stalled = (some or 0) >= 20 or (full or 0) >= 5
    errors = _sum(v, ("mce_events", "edac_ce", "edac_ue"))
    steal = _pair(v.get("cpu_steal_pct"), v.get("cpu_steal_max_core_pct"), "%", 1)
    iowait = _pair(v.get("cpu_iowait_pct"), v.get("cpu_iowait_max_core_pct"), "%", 1)
    cpu_title = f"steal {steal or '?'} (mean / worst core), iowait {iowait or '?'}"
    return [
        ("CPU", Cell(_num(v.get("cpu_util_pct"), "%"), title=cpu_title)),
        ("load", Cell(_num(v.get("load1"), digits=1))),
        ("memory available", Cell(memory, "bad" if low else None)),
        ("PSI memory some / full", Cell(_pair(some, full, "%", 1), "warn" if stalled else None, "avg10")),
        ("swap used", Cell(_num(v.get("swap_used_mib"), " MiB"))),
        ("MCE / EDAC", Cell(_num(errors), "warn" if errors else None, "machine checks, EDAC corrected + uncorrected")),
    ]


def _volume(v: dict[str, float | None]) -> list[tuple[str, Cell]]:
    free, pct = v.get("disk_free_bytes"), v.get("disk_free_pct")
    text = f"{_num(free / 2**30, ' GiB', 1)} ({_num(pct, '%')})" if free is not None else ""
    return [("free", Cell(text, "bad" if pct is not None and pct < 5 else None))]


_FORMATS = {"ib": _port, "roce": _port, "eth": _eth, "host": _host, "vol": _volume}


def machine_rows(session: Session, *, name: str, now: datetime, window_s: float) -> list[SubjectRow]:
    """The latest reading of each of the node's subjects within the window: host first, then ports, volumes."""
    rows = nodes.latest_node_samples(
        session, name=name, since=now - timedelta(seconds=window_s), columns=list(NODE_COLUMNS)
    )
    out = []
    for row in rows:
        values = {c: getattr(row, c) for c in NODE_COLUMNS}
        formatter = _FORMATS.get(subject_kind(row.subject))
        if formatter is not None:
            out.append(SubjectRow(row.subject, row.ts, formatter(values)))
    return sorted(out, key=lambda r: (_KIND_ORDER.get(subject_kind(r.subject), 9), r.subject))
