"""The host from the agent's own collector (agents/host.py): memory, pressure (PSI) and the watched volumes.

Limits: a node a job is about to land on needs room. Less than MIN_MEM_AVAILABLE_PCT of memory available, memory
or IO stalls above MAX_PSI_FULL_PCT (the share of the last 10 s every task waited: nothing else should run on
a drained node), or a watched volume under MIN_DISK_FREE_PCT free fails.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from agents.checks.result import CheckResult
from agents.counters import CounterTracker
from agents.host import HostCollector

MIN_MEM_AVAILABLE_PCT = 10.0
MAX_PSI_FULL_PCT = 5.0
MIN_DISK_FREE_PCT = 5.0


def run(
    *,
    procfs_root: str | os.PathLike[str] = "/proc",
    sysfs_root: str | os.PathLike[str] = "/sys",
    volumes: list[str] | None = None,
) -> list[CheckResult]:
    collector = HostCollector(procfs_root, sysfs_root, volumes=volumes or [], tracker=CounterTracker())
    items = collector.read(datetime.now(UTC).isoformat())
    out = []
    for item in items:
        fields: dict[str, Any] = item["fields"]
        if item["subject"] == "host":
            out += judge(fields)
        elif item["subject"].startswith("vol:"):
            free = fields.get("disk_free_pct")
            status = "fail" if free is not None and free < MIN_DISK_FREE_PCT else "pass"
            out.append(CheckResult("disk_free", item["subject"], status, free, MIN_DISK_FREE_PCT, "%", dict(fields)))
    return out


def judge(fields: dict[str, Any]) -> list[CheckResult]:
    """Memory available and pressure stalls from the host collector's fields."""
    out = []
    total, available = fields.get("mem_total_mib"), fields.get("mem_available_mib")
    if total and available is not None:
        pct = round(100.0 * available / total, 2)
        status = "fail" if pct < MIN_MEM_AVAILABLE_PCT else "pass"
        evidence = {
            "mem_total_mib": total,
            "mem_available_mib": available,
            "swap_used_mib": fields.get("swap_used_mib"),
        }
        out.append(CheckResult("memory_available", "host", status, pct, MIN_MEM_AVAILABLE_PCT, "%", evidence))
    psi = {k: v for k, v in fields.items() if k.startswith("psi_")}
    if psi:
        worst = max((v for k, v in psi.items() if k.endswith("full_avg10")), default=0.0)
        status = "fail" if worst > MAX_PSI_FULL_PCT else "pass"
        out.append(CheckResult("pressure", "host", status, worst, MAX_PSI_FULL_PCT, "%", psi))
    return out
