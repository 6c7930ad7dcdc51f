"""GPU-level remediation through the real diagnosis path: kernel lines in through the ingest API (the agent's
own parser), the event fast pass, the policy; reset_gpu for a catalog GPU-reset Xid on one GPU, eviction for a
repeat within the window and for a Xid that needs the node; by PCI bus id on a node that reported no GPU
inventory."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from lab.sim import logformat as fmt
from service.config import get_settings
from service.diagnosis.service import diagnose_events
from service.gpu_names import kernel_pci
from service.models import Decision, Incident
from tests.conftest import bearer

NODES, GPUS = 2, 8
# The GPU index -> PCI bus each node reports in its heartbeat (as a DGX's eight are numbered, roughly).
BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]


def _heartbeat() -> dict[str, Any]:
    return {
        "agent_version": "test",
        "gpus": [{"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"00000000:{b:02X}:00.0"} for i, b in enumerate(BUSES)],
    }


def _ship(
    client: Any, token: str, job: str, kernel_by_node: dict[int, str], *, at: datetime, inventory: bool = True
) -> None:
    for n in range(NODES):
        text = kernel_by_node.get(n, "")
        logs = [e.to_wire() for e in parse_text(KernelLogParser(), text, now=at)] if text else []
        batch = {
            "batch_id": str(uuid.uuid4()),
            "node": f"node-{n}",
            "sent_at": at.isoformat(),
            "job_id": job,
            "heartbeat": _heartbeat() if inventory else {"agent_version": "test"},
            "logs": logs,
            "processes": [
                {"ts": at.isoformat(), "pid": 1000 + r, "job_id": job, "rank": r, "local_rank": r - n * GPUS,
                 "world_size": NODES * GPUS, "cpu_pct": 50.0, "state": "S"}
                for r in range(n * GPUS, (n + 1) * GPUS)
            ],
        }  # fmt: skip
        response = client.post("/api/v1/ingest", json=batch, headers=bearer(token))
        assert response.status_code == 200, response.text


def _xid(code: int, gpu: int, at: datetime, text: str) -> str:
    return fmt.kern(at, fmt.xid(BUSES[gpu], code, text, 4242, "python")) + "\n"


def _decisions(session: Any, result: Any) -> list[Decision]:
    return list(session.scalars(select(Decision).where(Decision.id.in_(result.decisions)).order_by(Decision.id)))


def test_kernel_pci_matches_the_xid_lines_form() -> None:
    assert kernel_pci("00000000:3B:00.0") == "0000:3b:00"
    assert kernel_pci("0000:3b:00") == "0000:3b:00"
    assert kernel_pci("3b:00.0") == "0000:3b:00"
    assert kernel_pci("GPU-3") is None and kernel_pci(None) is None


def test_a_gpu_reset_xid_on_one_gpu_resets_it_and_a_repeat_within_the_window_evicts(
    client, session, make_token
) -> None:
    token, scheduler, job = make_token("agent"), make_token("scheduler"), f"job-{uuid.uuid4().hex[:6]}"
    settings = get_settings()
    first = datetime.now(UTC) - timedelta(minutes=4)
    # Xid 119 (GSP RPC timeout): the catalog's immediate action is RESET_GPU. GPU 3 of node-1.
    _ship(client, token, job, {1: _xid(119, 3, first, "Timeout after 6s of waiting for RPC response")}, at=first)

    result = diagnose_events(session, job_id=job, settings=settings, now=first + timedelta(seconds=2))
    (decision,) = _decisions(session, result)
    assert (decision.kind, decision.gpu, decision.state) == ("reset_gpu", 3, "pending")
    assert decision.reason.startswith("reset GPU 3 on node-1: Xid 119 ")
    assert decision.evidence["guard_rails"]["gpu_reset"] == "0 earlier reset(s) of GPU 3 in the last 24 h (at most 1)"
    assert decision.confidence == 0.9

    # A generic scheduler reads it from the API: the node, the GPU, the kind.
    session.flush()
    page = client.get(
        "/api/v1/decisions", params={"job": job, "kind": "reset_gpu", "state": "pending"}, headers=bearer(scheduler)
    ).json()
    assert [(d["id"], d["node"], d["gpu"], d["kind"]) for d in page["items"]] == [
        (decision.id, "node-1", 3, "reset_gpu")
    ]
    # Other kinds keep gpu null.
    single = client.get(f"/api/v1/decisions/{decision.id}", headers=bearer(scheduler)).json()
    assert single["gpu"] == 3

    # The scheduler resets it and says so: the incident is mitigated and resolves.
    acked = client.post(
        f"/api/v1/decisions/{decision.id}/ack", json={"outcome": "done", "message": "reset"}, headers=bearer(scheduler)
    )
    assert acked.status_code == 200, acked.text
    incident = session.get(Incident, decision.incident_id)
    session.refresh(incident)
    assert incident.state == "resolved"
    # Stamped by the database clock: date the reset back to when it was done, seconds after the Xid (evidence
    # observed before then is the same fault's, not a repeat).
    incident.resolved_at = first + timedelta(seconds=5)
    session.flush()

    # The same Xid on the same GPU three minutes later (after a quiet spell): a new fault of a GPU reset within
    # the window, so the node goes.
    second = first + timedelta(minutes=3)
    _ship(client, token, job, {1: _xid(119, 3, second, "Timeout after 6s of waiting for RPC response")}, at=second)
    result = diagnose_events(session, job_id=job, settings=settings, now=second + timedelta(seconds=2))
    (escalated,) = _decisions(session, result)
    assert (escalated.kind, escalated.gpu, escalated.state) == ("evict", None, "pending")
    assert escalated.incident_id != decision.incident_id
    assert escalated.reason.startswith(
        "evict node-1 to reboot it, rung 3 of 5 (reboot): GPU 3 was already reset 1 time in the last 24 h (at most 1); "
        "Xid 119 "
    )


def test_a_repeat_beyond_the_window_resets_again(client, session, make_token) -> None:
    token, scheduler, job = make_token("agent"), make_token("scheduler"), f"job-{uuid.uuid4().hex[:6]}"
    # The escalation ladder's hold time as short: a reset 3 minutes ago held by its measure too.
    settings = get_settings().model_copy(update={"policy_reset_gpu_window_s": 120.0, "policy_ladder_hold_s": 120.0})
    first = datetime.now(UTC) - timedelta(minutes=4)
    _ship(client, token, job, {0: _xid(94, 5, first, "Contained: SM (0x1). RST: No, D-RST: No")}, at=first)
    (one,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=first))
    assert (one.kind, one.node_id is not None, one.gpu) == ("reset_gpu", True, 5)
    session.flush()
    client.post(f"/api/v1/decisions/{one.id}/ack", json={"outcome": "done"}, headers=bearer(scheduler))

    # Decisions are stamped by the database clock: date the first reset (and its incident's resolution) back to
    # when its Xid came.
    one.created_at = first
    session.get_one(Incident, one.incident_id).resolved_at = first + timedelta(seconds=5)
    session.flush()
    second = first + timedelta(minutes=3)  # 180 s later: the 120 s window holds no earlier reset
    _ship(client, token, job, {0: _xid(94, 5, second, "Contained: SM (0x1). RST: No, D-RST: No")}, at=second)
    (two,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=second))
    assert (two.kind, two.gpu) == ("reset_gpu", 5)


def test_a_xid_that_needs_the_node_still_evicts(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC)
    # Xid 79: the catalog says RESTART_BM (reboot the machine), not a GPU reset.
    _ship(client, token, job, {1: _xid(79, 3, now, "GPU has fallen off the bus.")}, at=now)
    (decision,) = _decisions(session, diagnose_events(session, job_id=job, settings=get_settings(), now=now))
    assert (decision.kind, decision.gpu) == ("evict", None)
    assert "gpu_reset" not in decision.evidence["guard_rails"]


def test_resettable_xids_on_two_gpus_evict_the_node(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC)
    text = _xid(119, 3, now, "Timeout") + _xid(119, 6, now, "Timeout")
    _ship(client, token, job, {1: text}, at=now)
    (decision,) = _decisions(session, diagnose_events(session, job_id=job, settings=get_settings(), now=now))
    assert (decision.kind, decision.gpu) == ("evict", None)


def test_disabled_reset_gpu_evicts_as_before(client, session, make_token) -> None:
    token, job = make_token("agent"), f"job-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC)
    _ship(client, token, job, {1: _xid(119, 3, now, "Timeout")}, at=now)
    settings = get_settings().model_copy(update={"policy_reset_gpu_enabled": False})
    (decision,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=now))
    assert (decision.kind, decision.gpu) == ("evict", None)


def test_a_node_without_gpu_inventory_gets_a_reset_by_pci_bus_id_saying_why(client, session, make_token) -> None:
    token, scheduler, job = make_token("agent"), make_token("scheduler"), f"job-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC)
    # A kernel-log-only agent: its heartbeat names no GPU, so only the Xid line's PCI address is known.
    _ship(client, token, job, {1: _xid(119, 3, now, "Timeout")}, at=now, inventory=False)
    (decision,) = _decisions(session, diagnose_events(session, job_id=job, settings=get_settings(), now=now))
    assert (decision.kind, decision.gpu, decision.gpu_pci, decision.state) == (
        "reset_gpu",
        None,
        "0000:5d:00.0",
        "pending",
    )
    assert decision.reason.startswith(
        "reset GPU 0000:5d:00.0 on node-1 (not in its GPU inventory: addressed by PCI bus id): Xid 119 "
    )
    rails = decision.evidence["guard_rails"]
    assert rails["gpu_reset"] == "0 earlier reset(s) of GPU 0000:5d:00.0 in the last 24 h (at most 1)"
    assert rails["gpu_address"] == "not in node-1's GPU inventory: addressed by PCI bus id"

    # A scheduler reads the bus id in place of the index.
    session.flush()
    page = client.get(
        "/api/v1/decisions", params={"job": job, "kind": "reset_gpu", "state": "pending"}, headers=bearer(scheduler)
    ).json()
    assert [(d["node"], d["gpu"], d["gpu_pci"]) for d in page["items"]] == [("node-1", None, "0000:5d:00.0")]


def test_a_gpu_reset_by_pci_then_again_by_index_counts_as_one_gpu(client, session, make_token) -> None:
    token, scheduler, job = make_token("agent"), make_token("scheduler"), f"job-{uuid.uuid4().hex[:6]}"
    settings = get_settings()
    first = datetime.now(UTC) - timedelta(minutes=4)
    _ship(client, token, job, {1: _xid(119, 3, first, "Timeout")}, at=first, inventory=False)
    (reset,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=first))
    assert (reset.kind, reset.gpu, reset.gpu_pci) == ("reset_gpu", None, "0000:5d:00.0")
    session.flush()
    client.post(f"/api/v1/decisions/{reset.id}/ack", json={"outcome": "done"}, headers=bearer(scheduler))
    session.get_one(Incident, reset.incident_id).resolved_at = first + timedelta(seconds=5)
    session.flush()

    # The node's agent now reports its GPUs (NVML came back): the same GPU, by index now, was reset already.
    second = first + timedelta(minutes=3)
    _ship(client, token, job, {1: _xid(119, 3, second, "Timeout")}, at=second)
    (escalated,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=second))
    assert (escalated.kind, escalated.gpu, escalated.gpu_pci) == ("evict", None, None)
    assert escalated.reason.startswith(
        "evict node-1 to reboot it, rung 3 of 5 (reboot): GPU 3 was already reset 1 time in the last 24 h (at most 1); "
    )


def test_a_gpu_reset_by_pci_twice_within_the_window_evicts(client, session, make_token) -> None:
    token, scheduler, job = make_token("agent"), make_token("scheduler"), f"job-{uuid.uuid4().hex[:6]}"
    settings = get_settings()
    first = datetime.now(UTC) - timedelta(minutes=4)
    _ship(client, token, job, {1: _xid(119, 3, first, "Timeout")}, at=first, inventory=False)
    (reset,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=first))
    session.flush()
    client.post(f"/api/v1/decisions/{reset.id}/ack", json={"outcome": "done"}, headers=bearer(scheduler))
    session.get_one(Incident, reset.incident_id).resolved_at = first + timedelta(seconds=5)
    session.flush()

    second = first + timedelta(minutes=3)
    _ship(client, token, job, {1: _xid(119, 3, second, "Timeout")}, at=second, inventory=False)
    (escalated,) = _decisions(session, diagnose_events(session, job_id=job, settings=settings, now=second))
    assert (escalated.kind, escalated.gpu, escalated.gpu_pci) == ("evict", None, None)
    assert escalated.reason.startswith(
        "evict node-1 to reboot it, rung 3 of 5 (reboot): GPU 0000:5d:00.0 was already reset 1 time in the last 24 h "
        "(at most 1); Xid 119 "
    )
