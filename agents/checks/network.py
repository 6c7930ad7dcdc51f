"""InfiniBand/RoCE ports from sysfs, through the agent's own collector (agents/network.py): state and rate once,
error counters before and after the suite's traffic (the all-reduces run in between).

A port fails when it is not ACTIVE/LinkUp, when it runs slower than the fastest port of the same kind on the
node (a link that trained down: 200 of 400 Gb/s), or when an error counter grew while the checks ran.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from agents.checks.result import CheckResult, not_available
from agents.network import NetworkCollector

CHECK = "ib_port"
IB_ACTIVE = 4  # enum ib_port_state
PHYS_LINK_UP = 5  # "5: LinkUp"
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


def _rdma(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["subject"]: i["fields"] for i in items if i["subject"].startswith(("ib:", "roce:"))}


class PortWatch:
    """The node's RDMA ports read once at `start()` and again at `finish()`."""

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys") -> None:
        self.collector = NetworkCollector(sysfs_root)
        self.before: dict[str, dict[str, Any]] = {}

    def _read(self) -> dict[str, dict[str, Any]]:
        return _rdma(self.collector.read(datetime.now(UTC).isoformat()))

    def start(self) -> None:
        self.before = self._read()

    def finish(self) -> list[CheckResult]:
        after = self._read()
        self.collector.close()
        if not after:
            return [not_available(CHECK, "no InfiniBand or RoCE port on this node")]
        fastest: dict[str, float] = {}
        for subject, fields in after.items():
            kind = subject.split(":", 1)[0]
            fastest[kind] = max(fastest.get(kind, 0.0), fields.get("port_rate_gbps") or 0.0)
        out = []
        for subject, fields in sorted(after.items()):
            problems = []
            if fields.get("port_state") != IB_ACTIVE:
                problems.append(f"port state {fields.get('port_state')} (4 is ACTIVE)")
            if fields.get("port_phys_state") not in (None, PHYS_LINK_UP):
                problems.append(f"physical state {fields.get('port_phys_state')} (5 is LinkUp)")
            rate = fields.get("port_rate_gbps")
            best = fastest[subject.split(":", 1)[0]]
            if rate is not None and rate < best:
                problems.append(f"{rate:g} Gb/s where the node's other ports run {best:g}")
            grew = {}
            for name in ERROR_COUNTERS:
                was, now = self.before.get(subject, {}).get(name), fields.get(name)
                if was is not None and now is not None and now > was:
                    grew[name] = now - was
            if grew:
                problems.append(
                    "error counters grew during the checks: " + ", ".join(f"{k} +{v}" for k, v in grew.items())
                )
            evidence: dict[str, Any] = {
                "rate_gbps": rate,
                "counters": {k: fields.get(k) for k in ERROR_COUNTERS if k in fields},
            }
            if problems:
                evidence["problems"] = problems
            out.append(
                CheckResult(
                    CHECK,
                    subject,
                    "fail" if problems else "pass",
                    measured=rate,
                    expected=best or None,
                    unit="Gb/s",
                    evidence=evidence,
                )
            )
        return out
