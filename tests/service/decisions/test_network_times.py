"""What the network flap tolerance counts (service/decisions/service.py, network_times): the distinct times a node's
network faults were seen, a port's flap counted once however many findings report it (named by its link_downed); and
the flap that needs no second one (broken_flaps, lone_broken_flaps): it broke the job's connections, alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from service.config import Settings
from service.decisions.service import broken_flaps, lone_broken_flaps, network_times

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
PORT = "ib:mlx5_3/1"


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _flaps(*flaps: tuple[int | None, float]) -> dict[str, Any]:
    return {
        "port_flaps": [{"port": PORT, "link_downed": n, "at": _at(s).isoformat()} for n, s in flaps],
        "times": [_at(s).isoformat() for _, s in flaps],
    }


def test_one_flap_from_the_port_watch_and_the_window_rule_is_one_fault_at_its_first_report() -> None:
    rows = [
        ("n1", _at(0.6), _flaps((4, 0.6))),  # the agent's port watch, within a second
        ("n1", _at(16), _flaps((4, 16))),  # the 10 s window rule, the same flap
    ]
    assert network_times(rows) == {"n1": [_at(0.6)]}
    # The second flap: two faults, whoever saw it first.
    rows += [("n1", _at(24), _flaps((4, 0.6), (5, 24))), ("n1", _at(36), _flaps((4, 16), (5, 36)))]
    assert network_times(rows) == {"n1": [_at(0.6), _at(24)]}


def test_nccls_error_of_a_flap_is_that_flap_and_other_faults_count_by_their_times() -> None:
    rows = [
        ("n1", _at(0.2), {"times": [_at(0.2).isoformat()]}),  # NCCL's IB completion error of the same moment
        ("n1", _at(0.6), _flaps((4, 0.6))),
        ("n1", _at(8), {"times": [_at(8).isoformat()]}),  # its retries ran out 7.5 s later: the same flap
        ("n2", _at(20), _flaps((None, 20))),  # a state drop the counter missed: no name, its time
        ("n2", _at(20), _flaps((None, 20))),
    ]
    assert network_times(rows) == {"n1": [_at(0.6)], "n2": [_at(20)]}
    # An error half a minute after the flap is a fault of its own.
    rows.append(("n1", _at(40), {"times": [_at(40).isoformat()]}))
    assert network_times(rows)["n1"] == [_at(0.6), _at(40)]


def _lost(s: float) -> dict[str, Any]:
    """NCCL's IB completion error with a link status (retries exceeded): the connections are gone."""
    return {"times": [_at(s).isoformat()], "statuses": [12], "connections_lost": True}


def test_a_flap_broke_the_jobs_connections_when_its_nodes_link_errors_came_with_it() -> None:
    rows = [("n1", _at(0.2), _lost(0.2)), ("n1", _at(0.6), _flaps((4, 0.6)))]
    assert broken_flaps(rows) == {"n1": _at(0.6)}
    # Errors without a link status (a protection error), or minutes away, or on another node: not this flap's.
    assert broken_flaps([("n1", _at(0.2), {"times": [_at(0.2).isoformat()], "statuses": [4]}), rows[1]]) == {}
    assert broken_flaps([("n1", _at(60), _lost(60)), rows[1]]) == {}
    assert broken_flaps([("n2", _at(0.2), _lost(0.2)), rows[1]]) == {}


def test_a_broken_flap_needs_no_second_only_once_no_other_machines_link_dropped_near_it() -> None:
    rows = [("n1", _at(0.2), _lost(0.2)), ("n1", _at(0.6), _flaps((4, 0.6)))]
    settings = Settings(database_url="postgresql://x", redis_url="redis://x")  # 10 s
    asked: list[datetime] = []

    def drops(elsewhere: dict[str, list[datetime]]) -> Any:
        def since(t: datetime) -> dict[str, list[datetime]]:
            asked.append(t)
            return elsewhere

        return since

    alone = drops({"n1": [_at(0.6)], "n3": [_at(45)]})  # its own drop, and another machine's well after
    assert lone_broken_flaps(rows, drops_since=alone, now=_at(11), settings=settings) == {"n1": _at(0.6)}
    assert asked == [_at(0.6) - timedelta(seconds=10)]
    # Too young to know (and nothing read), a switch's other machine within 10 s, or out of the flap window.
    assert lone_broken_flaps(rows, drops_since=alone, now=_at(5), settings=settings) == {}
    assert len(asked) == 1
    switch = drops({"n2": [_at(1.1)]})
    assert lone_broken_flaps(rows, drops_since=switch, now=_at(11), settings=settings) == {}
    assert lone_broken_flaps(rows, drops_since=alone, now=_at(400), settings=settings) == {}
    off = settings.model_copy(update={"policy_network_broken_flap_s": 0.0})
    assert lone_broken_flaps(rows, drops_since=alone, now=_at(11), settings=off) == {}
