"""Machine-level readings for a batch's `node_metrics`: the network and host collectors, each fenced off.

A collector that raises (a driver with an odd file, a kernel we never saw) costs its own readings for that
tick and one log line, never the agent: GPU samples, logs and stacks keep flowing.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents.counters import CounterTracker
from agents.host import HostCollector
from agents.network import NetworkCollector

log = logging.getLogger(__name__)

# The service's subject rule (ml/node_metrics.py SUBJECT_PATTERN, 128 characters at most; a test holds the two
# equal): a batch with one subject outside it is refused whole, so an odd netdev name or a long volume path
# is left out here instead.
SUBJECT = re.compile(r"^(host|(ib|roce):[A-Za-z0-9_.-]+/[0-9]+|eth:[A-Za-z0-9_.:@-]+|vol:/.*)$")
SUBJECT_MAX = 128


class NodeCollectors:
    """The network and host collectors of one agent, read together once per ship tick."""

    def __init__(
        self,
        *,
        sysfs_root: str | os.PathLike[str],
        procfs_root: str | os.PathLike[str],
        volumes: list[str],
        location: dict[str, str] | None = None,
        storage_mounts: list[str] | None = None,
    ) -> None:
        # Where the machine sits (rack, switch, power domain: the operator's settings) and the storage it reads:
        # heartbeat facts the service keeps as the node's labels, to find a cause several nodes share.
        self.location = dict(location or {})
        self.storage_mounts = list(storage_mounts or [])
        tracker = CounterTracker()
        self.network = NetworkCollector(sysfs_root, tracker=tracker)
        self.host = HostCollector(procfs_root, sysfs_root, volumes=volumes, tracker=tracker)
        self._failed: set[str] = set()
        self._bad_subjects: set[str] = set()

    def prime(self) -> None:
        """A first CPU reading, so the first batch already has CPU percentages."""
        self._guard("host", self.host.prime)

    def read(self, ts: str | None = None) -> list[dict[str, Any]]:
        ts = ts or datetime.now(UTC).isoformat()
        items: list[dict[str, Any]] = []
        items += self._guard("network", lambda: self.network.read(ts)) or []
        items += self._guard("host", lambda: self.host.read(ts)) or []
        return [item for item in items if self._valid(item["subject"])]

    def link_states(self) -> dict[str, tuple[int | None, int | None]]:
        """The RDMA ports' (state, link_downed) now, for the watch between ship ticks (agents/port_watch.py)."""
        return self._guard("port watch", self.network.link_states) or {}

    def facts(self) -> dict[str, Any]:
        """The heartbeat's `host` object (wire.md): driver, kernel, GPU firmware, RDMA presence, fabric manager, ports
        seen, and the operator's location labels and storage mounts."""
        facts: dict[str, Any] = self._guard("host facts", self.host.facts) or {"driver_version": None, "kernel": None}
        facts["rdma"] = self.network.rdma
        facts["fabric_manager"] = self._guard("fabric manager", self.host.fabric_manager_state)
        facts["ports"] = [s for s in self.network.subjects if self._valid(s)][:256]
        facts.update(self.location)
        if self.storage_mounts:
            facts["storage_mounts"] = self.storage_mounts[:32]
        return facts

    def close(self) -> None:
        self.network.close()

    def _valid(self, subject: str) -> bool:
        if len(subject) <= SUBJECT_MAX and SUBJECT.match(subject):
            return True
        if subject not in self._bad_subjects:
            log.warning("leaving out %r: the service takes no such subject (name too long or odd)", subject)
            self._bad_subjects.add(subject)
        return False

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
