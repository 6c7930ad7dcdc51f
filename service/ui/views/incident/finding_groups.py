"""An incident's findings grouped by detector and subject, so a fault that fires for an hour reads as one row:
the count, a sparkline of the group's confidence over time, the first and the latest finding, the rest folded."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from service.incidents.schemas import FindingOut

SPARK_WIDTH = 120
SPARK_HEIGHT = 24


@dataclass
class FindingRow:
    finding: FindingOut
    numbers: list[tuple[str, str]]  # the evidence's scalar fields, for counters and anything not plotted
    accuses: bool  # listed by a suspect
    subject: str  # the subject as read: "node-3 GPU 7" rather than "node-3/0000:df:00"
    summary: str  # the detector's sentence, GPUs named by index where known


@dataclass
class FindingGroup:
    detector: str
    subject: str
    rows: list[FindingRow]  # the group's FindingRow items, oldest first
    accuses: bool  # some finding of the group is listed by a suspect
    spark: str = field(default="")  # SVG polyline points of confidence over time; empty for a single finding

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def first(self) -> FindingRow:
        return self.rows[0]

    @property
    def latest(self) -> FindingRow:
        return self.rows[-1]

    @property
    def middle(self) -> list[FindingRow]:
        """Those between the first and the latest: behind a toggle."""
        return self.rows[1:-1]


def sparkline(findings: list[FindingOut], width: int = SPARK_WIDTH, height: int = SPARK_HEIGHT) -> str:
    """Points of a polyline: time across, confidence (0 to 1) up; empty when there is nothing to draw a line of."""
    if len(findings) < 2:
        return ""
    start = findings[0].observed_at
    span = (findings[-1].observed_at - start).total_seconds()
    points = []
    for i, f in enumerate(findings):
        # Findings at one instant (a batch) spread evenly rather than stacking on one x.
        x = (f.observed_at - start).total_seconds() / span if span > 0 else i / (len(findings) - 1)
        y = 1 - min(1.0, max(0.0, f.confidence))
        points.append(f"{x * (width - 2) + 1:.1f},{y * (height - 2) + 1:.1f}")
    return " ".join(points)


def group_findings(rows: Iterable[FindingRow]) -> list[FindingGroup]:
    """Groups by (detector, subject); the groups that accuse a suspect first, then causes, then by confidence."""
    groups: dict[tuple[str, str], list[FindingRow]] = {}
    for row in rows:
        groups.setdefault((row.finding.detector, row.subject), []).append(row)
    out = []
    for (detector, subject), members in groups.items():
        members.sort(key=lambda r: (r.finding.observed_at, r.finding.id))
        out.append(
            FindingGroup(
                detector=detector,
                subject=subject,
                rows=members,
                accuses=any(r.accuses for r in members),
                spark=sparkline([r.finding for r in members]),
            )
        )
    return sorted(
        out,
        key=lambda g: (
            not g.accuses,
            all(r.finding.role != "cause" for r in g.rows),
            -max(r.finding.confidence for r in g.rows),
        ),
    )
