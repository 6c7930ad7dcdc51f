"""Repair-time arithmetic: the stages of one incident, and p50/p90 per fleet, root cause and node (hand-computed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ml.repair_times import DecisionRow, aggregate, incident_times, summarize

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_stages_of_one_incident() -> None:
    decisions = [
        DecisionRow(node="n1", state="done", created_at=_t(20), acked_at=_t(80)),
        # Decided earlier but never acted on (it expired): it is the first decision, not the first action.
        DecisionRow(node=None, state="expired", created_at=_t(18), acked_at=_t(19)),
    ]
    t = incident_times(
        incident_id=1,
        root_cause="gpu_hardware",
        opened_at=_t(12),
        evidence_at=_t(0),
        decisions=decisions,
        outs=[("n1", _t(80))],
        # A return before the eviction belongs to an earlier outage.
        backs={"n1": [_t(-500), _t(1880), _t(9000)]},
    )
    assert (t.detect_s, t.decide_s, t.act_s, t.return_s) == (12, 6, 60, 1800)
    assert t.nodes == ("n1",)


def test_stages_not_yet_reached_have_no_value_and_a_clock_ahead_counts_zero() -> None:
    t = incident_times(
        incident_id=2,
        root_cause="network",
        opened_at=_t(10),
        evidence_at=_t(15),  # the agent's clock ran ahead of the service's
        decisions=[DecisionRow(node="n2", state="pending", created_at=_t(40), acked_at=None)],
        outs=[("n3", _t(50))],
        backs={},
    )
    assert t.detect_s == 0 and t.decide_s == 30 and t.act_s is None
    # n3 is still out: the incident has not returned.
    assert t.return_s is None and t.outages[0].seconds is None
    assert t.nodes == ("n2", "n3")


def test_percentiles_interpolate_between_ranks() -> None:
    s = summarize([40, 2, 12])
    assert (s.count, s.p50, s.max) == (3, 12, 40)
    assert s.p90 == pytest.approx(12 + 0.8 * 28)
    assert summarize([]).p50 is None


def _three() -> list:
    a = incident_times(
        incident_id=1,
        root_cause="gpu_hardware",
        opened_at=_t(12),
        evidence_at=_t(0),
        decisions=[DecisionRow(node="n1", state="done", created_at=_t(20), acked_at=_t(80))],
        outs=[("n1", _t(80))],
        backs={"n1": [_t(1880)]},
    )
    b = incident_times(
        incident_id=2,
        root_cause="network",
        opened_at=_t(5040),
        evidence_at=_t(5000),
        decisions=[
            DecisionRow(node="n2", state="done", created_at=_t(5100), acked_at=_t(5130)),
            DecisionRow(node="n3", state="failed", created_at=_t(5100), acked_at=_t(5400)),
        ],
        outs=[("n2", _t(5130))],
        backs={"n2": [_t(5730)]},
    )
    c = incident_times(
        incident_id=3,
        root_cause="gpu_hardware",
        opened_at=_t(10002),
        evidence_at=_t(10000),
        decisions=[DecisionRow(node="n1", state="done", created_at=_t(10006), acked_at=_t(10016))],
        outs=[("n1", _t(10016))],
        backs={"n1": [_t(1880)]},
    )
    return [a, b, c]


def test_fleet_root_cause_and_node_groups() -> None:
    (fleet,) = aggregate(_three(), by="fleet")
    s = fleet.stages
    assert fleet.incidents == 3
    assert (s["detect"].p50, s["detect"].p90) == (12, pytest.approx(34.4))
    assert (s["decide"].p50, s["decide"].p90) == (8, pytest.approx(49.6))
    assert (s["act"].p50, s["act"].p90) == (30, pytest.approx(54))
    # Two outages ended (1800 s, 600 s); the third node is still out.
    assert (s["return"].count, s["return"].p50, s["return"].p90) == (2, 1200, pytest.approx(1680))

    causes = {g.key: g for g in aggregate(_three(), by="root_cause")}
    assert causes["gpu_hardware"].incidents == 2
    assert (causes["gpu_hardware"].stages["detect"].p50, causes["gpu_hardware"].stages["detect"].p90) == (
        7,
        pytest.approx(11),
    )
    assert causes["network"].stages["return"].p50 == 600

    nodes = aggregate(_three(), by="node")
    # Slowest first: n1 out 1800 s, n2 600 s, n3 never taken out.
    assert [g.key for g in nodes] == ["n1", "n2", "n3"]
    assert nodes[0].incidents == 2 and nodes[0].stages["act"].p50 == 35
    assert nodes[2].stages["return"].count == 0 and nodes[2].stages["act"].p50 == 30

    with pytest.raises(ValueError, match="by must be one of"):
        aggregate([], by="gpu")
