"""The fleet page: repair times (detect, decide, act, return) over a chosen window, per root cause, slowest nodes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from ml import repair_times, spares
from ml.repair_times import STAGES
from service.errors import InvalidInput
from service.fleet import service as fleet

# The windows the page offers: label -> seconds.
WINDOWS = {"24h": 86_400.0, "7d": 7 * 86_400.0, "30d": 30 * 86_400.0, "90d": 90 * 86_400.0}
SLOWEST_NODES = 10


@dataclass
class FleetView:
    window: str
    incidents: int
    fleet: repair_times.Group | None
    root_causes: list[repair_times.Group]
    slowest_nodes: list[repair_times.Group]
    more_nodes: int
    stages: tuple[str, ...] = STAGES


def fleet_view(session: Session, *, window: str, now: datetime) -> FleetView:
    """Everything the page shows, from one read of the window's incidents."""
    if window not in WINDOWS:
        raise InvalidInput(f"window: {window!r} is not one of {', '.join(WINDOWS)}")
    times = fleet.window_times(session, window_s=WINDOWS[window], now=now)
    nodes = repair_times.aggregate(times, by="node")
    return FleetView(
        window=window,
        incidents=len(times),
        fleet=next(iter(repair_times.aggregate(times, by="fleet")), None),
        root_causes=repair_times.aggregate(times, by="root_cause"),
        slowest_nodes=nodes[:SLOWEST_NODES],
        more_nodes=max(0, len(nodes) - SLOWEST_NODES),
    )


# The job page's standby line: a day ahead at p99, from the last 30 days of the fleet's failures.
JOB_SPARES_HORIZON_S = 86_400.0
JOB_SPARES_QUANTILE = 0.99
JOB_SPARES_WINDOW_S = 30 * 86_400.0


@dataclass
class JobSpares:
    nodes: int
    advice: spares.Advice | None  # None while no rank of the job is placed on a node

    @property
    def window_days(self) -> float:
        return JOB_SPARES_WINDOW_S / 86_400


def job_spares(session: Session, *, job_id: str, now: datetime) -> JobSpares:
    """The warm standbys the job's placed nodes need (none computed before any rank is placed)."""
    nodes = fleet.job_nodes(session, job_id=job_id)
    if nodes == 0:
        return JobSpares(nodes=0, advice=None)
    advice = fleet.spares_for(
        session,
        nodes=nodes,
        horizon_s=JOB_SPARES_HORIZON_S,
        quantile=JOB_SPARES_QUANTILE,
        window_s=JOB_SPARES_WINDOW_S,
        now=now,
    )
    return JobSpares(nodes=nodes, advice=advice)
