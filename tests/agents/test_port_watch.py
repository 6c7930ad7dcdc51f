"""The RDMA ports' watch between ship ticks (agents/port_watch.py) on a copy of the fake sysfs: a port that leaves
ACTIVE, or whose link_downed rose between two reads, is one critical `port_down` event, named by its counter."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.network import NetworkCollector
from agents.port_watch import PortWatch
from tests import paths

PORT = "class/infiniband/mlx5_3/ports/1"
NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return Path(shutil.copytree(paths.FIXTURES / "sysfs", tmp_path / "sys"))


def _write(root: Path, state: str, downed: int) -> None:
    (root / PORT / "state").write_text(f"{state}\n")
    (root / PORT / "counters" / "link_downed").write_text(f"{downed}\n")


def test_a_port_going_down_is_one_critical_event_named_by_its_counter(sysfs: Path) -> None:
    collector, watch = NetworkCollector(sysfs), PortWatch()
    collector.read(NOW.isoformat())  # finds the ports, as the ship tick does
    states = collector.link_states()
    assert states["ib:mlx5_3/1"] == (4, 3) and states["roce:mlx5_4/1"][0] == 4
    assert watch.changes(states, NOW) == []  # first sight: nothing to compare with
    assert watch.changes(collector.link_states(), NOW) == []
    _write(sysfs, "1: DOWN", 4)
    (event,) = watch.changes(collector.link_states(), NOW)
    assert (event.kind, event.source, event.severity, event.critical) == ("port_down", "sysfs", "error", True)
    assert event.fields == {"port": "ib:mlx5_3/1", "state": 1, "was": 4, "link_downed": 4}
    assert "link down (state 4 -> 1, link_downed 3 -> 4)" in event.line
    # Still down, then trained (INIT), then ACTIVE again: the same flap, no further event.
    assert watch.changes(collector.link_states(), NOW) == []
    _write(sysfs, "2: INIT", 4)
    assert watch.changes(collector.link_states(), NOW) == []
    _write(sysfs, "4: ACTIVE", 4)
    assert watch.changes(collector.link_states(), NOW) == []


def test_a_flap_between_two_reads_shows_in_the_counter_alone(sysfs: Path) -> None:
    collector, watch = NetworkCollector(sysfs), PortWatch()
    collector.read(NOW.isoformat())
    watch.changes(collector.link_states(), NOW)
    _write(sysfs, "4: ACTIVE", 5)  # down and back up within the second
    (event,) = watch.changes(collector.link_states(), NOW)
    assert event.fields["link_downed"] == 5 and "down and back up" in event.line


def test_a_counter_cleared_or_a_port_unknown_is_no_flap(sysfs: Path) -> None:
    collector, watch = NetworkCollector(sysfs), PortWatch()
    collector.read(NOW.isoformat())
    watch.changes(collector.link_states(), NOW)
    _write(sysfs, "4: ACTIVE", 0)  # perfquery -x cleared it
    assert watch.changes(collector.link_states(), NOW) == []
    _write(sysfs, "0: NOP", 0)  # nothing reported yet: unknown, not down
    assert watch.changes(collector.link_states(), NOW) == []
    shutil.rmtree(sysfs / "class/infiniband/mlx5_3")  # hot-removed: forgotten, not an error
    assert "ib:mlx5_3/1" not in collector.link_states()
    assert watch.changes(collector.link_states(), NOW) == []
