"""Machine-level readings for a batch's `node_metrics`: the network and host collectors, each fenced off.

A collector that raises (a driver with an odd file, a kernel we never saw) costs its own readings for that
tick and one log line, never the agent: GPU samples, logs and stacks keep flowing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents.counters import CounterTracker
from agents.host import HostCollector
from agents.network import NetworkCollector

log = logging.getLogger(__name__)


class NodeCollectors:
    """The network and host collectors of one agent, read together once per ship tick."""

    def __init__(self, *, sysfs_root: str | os.PathLike[str], procfs_root: str | os.PathLike[str], volumes: list[str]):
        tracker = CounterTracker()
        self.network = NetworkCollector(sysfs_root, tracker=tracker)
        self.host = HostCollector(procfs_root, sysfs_root, volumes=volumes, tracker=tracker)
        self._failed: set[str] = set()

    def prime(self) -> None:
        """A first CPU reading, so the first batch already has CPU percentages."""
        self._guard("host", self.host.prime)

    def read(self, ts: str | None = None) -> list[dict[str, Any]]:
        ts = ts or datetime.now(UTC).isoformat()
        items: list[dict[str, Any]] = []
        items += self._guard("network", lambda: self.network.read(ts)) or []
        items += self._guard("host", lambda: self.host.read(ts)) or []
        return items

    def facts(self) -> dict[str, Any]:
        """The heartbeat's `host` object (wire.md): driver version, kernel, RDMA presence, ports seen."""
        facts: dict[str, Any] = self._guard("host facts", self.host.facts) or {"driver_version": None, "kernel": None}
        facts["rdma"] = self.network.rdma
        facts["ports"] = self.network.subjects[:256]
        return facts

    def close(self) -> None:
        self.network.close()

    def _guard(self, name: str, call: Callable[[], Any]) -> Any:
        try:
            result = call()
        except Exception:
            if name not in self._failed:
                log.exception("the %s collector failed; its readings are left out until it works again", name)
                self._failed.add(name)
            return None
        if name in self._failed:
            log.info("the %s collector works again", name)
            self._failed.discard(name)
        return result
