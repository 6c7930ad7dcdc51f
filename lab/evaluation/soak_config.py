"""What a soak runs (`faultline eval --soak`, and the campaign on its harness): its jobs, its duration and its
config, read from the command line."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lab.sim.config import RealismParams

DAY_S = 86400.0
MAX_SIMULATED_S = 28 * DAY_S  # the simulated run lies in the past: within the ingest's 30-day window
END_MARGIN_S = 120.0  # the simulated run ends this long before the wall clock's now


@dataclass(frozen=True)
class SoakJob:
    name: str
    nodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    # Healthy in a soak; the tests give a job a fault, to show the harness's data reaches the detectors.
    scenario: str = "healthy"
    fault_after: float = 30.0
    fault_node: int | None = None  # the fault's node rank; None: the plan draws it


# Jobs of different sizes and shapes at once, on one service (8 nodes, 40 GPUs): small enough that a simulated
# day takes about an hour on two cores. Bigger ones: --soak-jobs.
DEFAULT_JOBS_SPEC = "2x8:tp8,4x4:tp2pp2,2x4"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY_S}


def parse_duration(text: str) -> float:
    """Seconds from `90s`, `30m`, `24h`, `2d` or a plain number of seconds; ValueError with the accepted forms."""
    m = _DURATION.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"bad soak duration {text!r}: give a positive number with s, m, h or d (e.g. 24h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_jobs(text: str) -> list[SoakJob]:
    """`4x8:tp8,8x8:tp8pp4,2x4`: nodes x GPUs per node, optionally :tpT and ppP; ValueError naming the bad one."""
    out = []
    for i, part in enumerate(p.strip() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+)x(\d+)(?::(?:tp(\d+))?(?:pp(\d+))?)?", part)
        if m is None:
            raise ValueError(
                f"bad soak job {part!r}: give NODESxGPUS, optionally :tpT, :ppP or :tpTppP (e.g. 8x8:tp8pp4)"
            )
        nodes, gpn, tp, pp = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1), int(m.group(4) or 1)
        if nodes < 1 or gpn < 1 or tp < 1 or pp < 1 or (nodes * gpn) % (tp * pp):
            raise ValueError(f"bad soak job {part!r}: tp x pp must divide nodes x GPUs, every number >= 1")
        out.append(SoakJob(chr(ord("a") + i), nodes, gpn, tp, pp))
    if not out:
        raise ValueError("no soak job given")
    return out


@dataclass
class SoakConfig:
    duration_s: float
    seed: int = 1
    jobs: tuple[SoakJob, ...] = field(default_factory=lambda: tuple(parse_jobs(DEFAULT_JOBS_SPEC)))
    # When simulated time 0 is, and the run's tag in job ids and node names: the same for every job's process.
    start: datetime = field(
        default_factory=lambda: (datetime.now(UTC) - timedelta(seconds=END_MARGIN_S)).replace(microsecond=0)
    )
    run_id: str = field(default_factory=lambda: f"{int(time.time()) % 100000:05d}")
    # The eval's: shorter than a checkpoint's pause (20-40 s), which must not pass for a hang.
    hang_timeout_s: int = 30
    realism: RealismParams = field(default_factory=RealismParams)
