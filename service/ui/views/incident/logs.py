"""The log lines an incident's evidence cites, fetched in one query and grouped for reading."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from service.nodes import service as nodes


@dataclass
class LogLine:
    id: int
    ts: datetime
    node: str | None
    source: str
    kind: str
    severity: str | None
    rank: int | None
    line: str
    finding_ids: list[int]


@dataclass
class LogGroup:
    """Lines of one source and kind (26 ranks' watchdog timeouts): read the first few, open the rest."""

    source: str
    kind: str
    lines: list[LogLine]
    nodes: list[str]
    ranks: list[int]
    finding_ids: list[int]

    @property
    def first(self) -> datetime:
        return self.lines[0].ts


def cited_lines(session: Session, *, ids: list[int], refs: Mapping[Any, list[int]]) -> list[LogLine]:
    """The log lines with these ids, oldest first, each with the findings that cite it."""
    return [
        LogLine(id=i, ts=ts, node=n, source=src, kind=k, severity=sev, rank=r, line=line, finding_ids=refs.get(i, []))
        for i, ts, n, src, k, sev, r, line in nodes.log_events_by_id(session, ids=ids)
    ]


def log_groups(lines: Iterable[LogLine]) -> list[LogGroup]:
    """Lines grouped by source and kind, groups in the order their first line came (the cause usually first)."""
    groups: dict[tuple[str, str], LogGroup] = {}
    for line in lines:
        g = groups.setdefault((line.source, line.kind), LogGroup(line.source, line.kind, [], [], [], []))
        g.lines.append(line)
        if line.node and line.node not in g.nodes:
            g.nodes.append(line.node)
        if line.rank is not None and line.rank not in g.ranks:
            g.ranks.append(line.rank)
        g.finding_ids += [i for i in line.finding_ids if i not in g.finding_ids]
    for g in groups.values():
        g.ranks.sort()
    return sorted(groups.values(), key=lambda g: g.first)
