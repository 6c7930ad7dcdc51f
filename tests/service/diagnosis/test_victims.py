"""A healthy machine unlike its peers because another machine broke is that fault's victim, never its suspect.

The demo: node-003's NVLink failed and the job restarted around it; node-000, never faulted, then had all its GPUs
"peers' outlier (low nvlink_rx_bytes)", which was merged into node-003's incident as "evict node-000 100%", and
after a reject came back on pcie_rx_bytes under another incident."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.findings import Finding
from service.incidents.service import resolve
from service.models import Decision, Incident, Job, Node
from service.models import Finding as FindingRow
from tests import rows
from tests.decide import decide, finding

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _link_fault(node: str, at: datetime) -> Finding:
    return finding(node, detector="counters", category="nvlink", at=at, key=f"nvlink:{node}/3", confidence=0.8)


def _unlike_peers(node: str, category: str, metric: str, at: datetime) -> Finding:
    return finding(
        node, detector="peers", category=category, at=at, key=f"{node}:{category}:{metric}",
        evidence={"metrics": [{"metric": metric, "direction": "low"}]},
    )  # fmt: skip


def _link_fault_dealt_with(session: Session, job: Job, node: str) -> None:
    """The machine's link fault at T0, decided, and its incident resolved a minute later (the node evicted)."""
    result = decide(session, job, [_link_fault(node, T0)], T0 + timedelta(seconds=20))
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(result.incidents)))
    resolve(session, incident=incident, resolution="mitigated: evict done", now=T0 + timedelta(minutes=1))


def _decided_nodes(session: Session, job: Job) -> set[str]:
    return set(
        session.scalars(select(Node.name).join(Decision, Decision.node_id == Node.id).where(Decision.job_id == job.id))
    )


def test_a_peer_outlier_after_another_machines_link_fault_is_its_victim(session: Session) -> None:
    job, broken, healthy = rows.job(session), rows.node(session), rows.node(session)
    fault = _link_fault(broken.name, T0)
    victim = _unlike_peers(healthy.name, "nvlink", "nvlink_rx_bytes", T0 + timedelta(minutes=2))
    result = decide(session, job, [fault, victim], T0 + timedelta(minutes=2))

    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(result.incidents)))
    assert [s["node"] for s in incident.suspects] == [broken.name]
    stored = session.scalar(select(FindingRow).where(FindingRow.node_id == healthy.id))
    assert stored is not None and stored.incident_id == incident.id, "kept as corroboration of the fault"
    assert _decided_nodes(session, job) == {broken.name}


def test_a_victim_after_the_fault_was_dealt_with_opens_nothing(session: Session) -> None:
    job, broken, healthy = rows.job(session), rows.node(session), rows.node(session)
    _link_fault_dealt_with(session, job, broken.name)

    # The job restarted around the broken machine; the healthy one's traffic differs from its peers' a while.
    later = T0 + timedelta(minutes=4)
    victims = [
        _unlike_peers(healthy.name, "nvlink", "nvlink_rx_bytes", later),
        _unlike_peers(healthy.name, "pcie", "pcie_rx_bytes", later),
    ]
    again = decide(session, job, victims, later)
    assert again.incidents == [] and again.decisions == []
    assert _decided_nodes(session, job) == {broken.name}

    # Long after the fault, the same comparison is a finding of its own again.
    much_later = T0 + timedelta(minutes=30)
    alone = decide(session, job, [_unlike_peers(healthy.name, "pcie", "pcie_tx_bytes", much_later)], much_later)
    assert alone.incidents and healthy.name in _decided_nodes(session, job)


def test_a_straggler_that_began_before_another_machines_fault_is_still_accused(session: Session) -> None:
    """two_faults: a straggler first, then a GPU lost on another machine: both are faults, both decided."""
    job, slow, lost = rows.job(session), rows.node(session), rows.node(session)
    straggler = _unlike_peers(slow.name, "straggler", "sm_clock", T0)
    xid = finding(lost.name, detector="signatures", category="gpu_hardware", at=T0 + timedelta(minutes=3), key="xid")
    decide(session, job, [straggler, xid], T0 + timedelta(minutes=3))
    assert _decided_nodes(session, job) == {slow.name, lost.name}


def test_a_gpu_hotter_than_its_peers_after_another_machines_fault_is_its_own_fault(session: Session) -> None:
    """The campaign's thermal straggler began 2 min after another machine's GPU was evicted: as that fault's
    victim it opened nothing for 15 min, then joined the next unrelated fault's incident. A victim waits, idle and
    cooler; a GPU hotter than its peers (and throttled) is its own fault."""
    job, broken, hot = rows.job(session), rows.node(session), rows.node(session)
    _link_fault_dealt_with(session, job, broken.name)

    later = T0 + timedelta(minutes=3)
    sides = [{"metric": "sm_clock", "direction": "low"}, {"metric": "gpu_temp", "direction": "high"}]
    throttled = finding(
        hot.name, detector="peers", category="straggler", at=later, key="thermal", evidence={"metrics": sides}
    )
    again = decide(session, job, [throttled], later)
    assert again.incidents and again.decisions and _decided_nodes(session, job) == {broken.name, hot.name}
    # The same clock alone is what any idle victim shows: still a victim.
    idle = finding(
        broken.name, detector="peers", category="straggler", at=later, key="idle",
        evidence={"metrics": sides[:1]},
    )  # fmt: skip
    other, third = rows.job(session), rows.node(session)
    decide(session, other, [_link_fault(third.name, T0), idle], later)
    assert _decided_nodes(session, other) == {third.name}


def test_a_gpu_busier_than_its_peers_while_another_machines_fault_is_open_is_its_own_fault(session: Session) -> None:
    """The 30-minute demo: node-002's GPU 4 was slowed (high tensor_active against its peers' for 120 s) while
    node-005's port errors had an open incident; taken for that fault's victim, it was never decided. Another
    machine's fault makes its peers wait, idle; a GPU that works longer each step than its peers is the slow one."""
    job, broken, slow = rows.job(session), rows.node(session), rows.node(session)
    later = T0 + timedelta(minutes=2)
    busier = finding(
        slow.name, detector="peers", category="straggler", at=later, key="busier",
        evidence={"metrics": [{"metric": "tensor_active", "direction": "high"}]},
    )  # fmt: skip
    result = decide(session, job, [_link_fault(broken.name, T0), busier], later)
    assert len(result.incidents) == 2 and _decided_nodes(session, job) == {broken.name, slow.name}
    # Less busy than its peers beside the same open fault: its victim, in the fault's incident.
    other, third, idle = rows.job(session), rows.node(session), rows.node(session)
    waiting = finding(
        idle.name, detector="peers", category="straggler", at=later, key="waiting",
        evidence={"metrics": [{"metric": "tensor_active", "direction": "low"}]},
    )  # fmt: skip
    decide(session, other, [_link_fault(third.name, T0), waiting], later)
    assert _decided_nodes(session, other) == {third.name}


def test_a_gpu_less_busy_than_its_peers_after_a_fault_was_dealt_with_is_its_own(session: Session) -> None:
    """The campaign's runaway data loaders each began a minute or more after another machine was evicted: taken for
    that fault's victims, 7 of 9 opened nothing and were drained by hand. A machine that moved less data around a
    restart can be a victim; one whose GPUs wait for their input after the faulty machine left is its own case."""
    job, broken, starved = rows.job(session), rows.node(session), rows.node(session)
    _link_fault_dealt_with(session, job, broken.name)
    later = T0 + timedelta(minutes=3)
    again = decide(session, job, [_unlike_peers(starved.name, "straggler", "gpu_util", later)], later)
    assert again.incidents and starved.name in _decided_nodes(session, job)


def _congested(node: str, at: datetime, rates: dict[str, float]) -> Finding:
    """node_signals' congestion finding: pause frames evict, waiting alone is diagnosed."""
    pauses = any(c.startswith("pause_") for c in rates)
    return finding(
        node, detector="node_signals", category="network", at=at, key=f"congestion:{node}:{sorted(rates)}",
        action="evict" if pauses else "diagnose", confidence=0.85 if pauses else 0.7,
        evidence={
            "rule": "congestion", "subject": "ib:mlx5_1/1", "rates": rates,
            "times": [(at - timedelta(minutes=2)).isoformat(), at.isoformat()],  # its 2 min of windows
        },
    )  # fmt: skip


def test_a_machine_sending_pause_frames_after_another_machines_eviction_is_its_own_fault(session: Session) -> None:
    """The 200-fault campaign: node a-000's NIC sent 30,000 PFC pause frames a second (its peers none), 6 min after
    another machine's eviction; taken for that fault's victim, it was never decided and was drained by hand."""
    job, broken, waiting, pausing = rows.job(session), rows.node(session), rows.node(session), rows.node(session)
    _link_fault_dealt_with(session, job, broken.name)
    later = T0 + timedelta(minutes=6)
    # Waiting to send alone: a victim's sign too (the job restarted around the broken machine). Nothing.
    alone = decide(session, job, [_congested(waiting.name, later, {"port_xmit_wait": 1.1e6})], later)
    assert alone.incidents == [] and alone.decisions == []
    # Pause frames sent: its own NIC's back-pressure. Its own incident, and it is evicted.
    own = decide(
        session, job, [_congested(pausing.name, later, {"port_xmit_wait": 1.1e6, "pause_tx_frames": 3e4})], later
    )
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(own.incidents)))
    assert [s["node"] for s in incident.suspects] == [pausing.name]
    assert _decided_nodes(session, job) == {broken.name, pausing.name}
