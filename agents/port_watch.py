"""A watch on the RDMA ports' links between ship ticks: a port that goes down is an event shipped at once.

The network collector reads every port's counters at the ship tick (5 s) and the service judges them in 10 s windows,
so a link that drops is decided some 20 s after it did. Reading two files a port (its state and its link_downed
counter) at every sample tick (1 s) tells it within a second: a port that left ACTIVE, or whose link_downed rose (it
went down and came back between two reads), gives a `port_down` event, critical, so the agent ships it at once and the
service's events pass counts the flap. Its counter value names the flap: the service's window rule sees the same
value later and counts the same flap once (service/decisions/service.py, network_times).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from agents.events import Event

IB_PORT_ACTIVE = 4  # include/rdma/ib_verbs.h enum ib_port_state: IB_PORT_ACTIVE


class PortWatch:
    """Remembers each port's last (state, link_downed); `changes` turns what went down since into events."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int | None, int | None]] = {}

    def changes(self, states: Mapping[str, tuple[int | None, int | None]], now: datetime) -> list[Event]:
        events: list[Event] = []
        for subject, (state, downed) in states.items():
            before = self._last.get(subject)
            self._last[subject] = (state, downed)
            if before is None:
                continue  # first sight (the agent's start, a port found later): nothing to compare with
            was, downed_before = before
            down_now = state is not None and state < IB_PORT_ACTIVE
            rose = downed is not None and downed_before is not None and downed > downed_before
            if not ((was == IB_PORT_ACTIVE and down_now) or rose):
                continue
            what = "down" if down_now else "down and back up"
            fields: dict[str, object] = {"port": subject, "state": state, "was": was, "link_downed": downed}
            events.append(
                Event(
                    ts=now,
                    source="sysfs",
                    kind="port_down",
                    line=f"{subject}: link {what} (state {was} -> {state}, link_downed {downed_before} -> {downed})",
                    severity="error",
                    fields=fields,
                    critical=True,
                )
            )
        for gone in set(self._last) - set(states):
            del self._last[gone]
        return events
