"""The escalation ladder through the live decide step (diagnosis.service._decide: store findings, demarcate, open
incidents, decide) on a simulated clock, with each decision carried out through the scheduler's acknowledgement
and the node put back in service: a GPU that faults again after each remedy climbs one rung each time, and its
decisions say which rung and why. Then the node's ladder through the API, the RMA mark, and a remedy that held."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ml.findings import Finding as MlFinding
from service.config import Settings, get_settings
from service.decisions import lifecycle
from service.diagnosis import service as diagnosis
from service.models import Decision, Finding, Incident, Job, Node
from service.nodes import service as nodes
from tests.conftest import bearer

# 08:00 two days ago: within the ladder's reach of the API's clock, each day's faults on one date, and a day and
# more later still in the past (a finding from the future is not taken).
T0 = datetime.now(UTC).replace(hour=8, minute=0, second=0, microsecond=0) - timedelta(days=2)
PCI = "0000:3b:00"
NODE = "ld-1"


def _settings(**changes: Any) -> Settings:
    return get_settings().model_copy(update=changes)


def _xid(at: datetime, key: str, node: str = NODE) -> MlFinding:
    """What the signatures make of a GSP timeout (Xid 119) on one GPU: a reset clears it, says the catalog."""
    return MlFinding(
        detector="signatures",
        category="gpu_hardware",
        subject_kind="gpu",
        subject=f"{node}/{PCI}",
        confidence=0.95,
        summary=f"Xid 119 (GSP RPC timeout) on {node} GPU {PCI}",
        observed_at=at,
        node=node,
        blame="infrastructure",
        role="cause",
        action="evict",
        key=key,
        evidence={"pci": PCI, "gpu_reset_enough": True},
    )


def _job(session: Session) -> Job:
    job = Job(external_id="ladder-job", source="registered", world_size=64)
    session.add(job)
    session.flush()
    for k in range(1, 9):
        session.add(Node(name=f"ld-{k}", current_job_id=job.id))
    session.flush()
    return job


def _fault(session: Session, job: Job, at: datetime, key: str, settings: Settings) -> list[Decision]:
    """One pass of the live decide step at `at` for a fault observed then; the rows it made get the pass's time
    (the test's transaction has one clock)."""
    result = diagnosis.DiagnosisResult(job_id=job.external_id)
    diagnosis._decide(session, job=job, findings=[_xid(at, key)], result=result, settings=settings, now=at)
    session.execute(update(Finding).where(Finding.created_at == func.now()).values(created_at=at))
    session.execute(update(Incident).where(Incident.opened_at == func.now()).values(opened_at=at))
    session.execute(update(Decision).where(Decision.created_at == func.now()).values(created_at=at))
    session.flush()
    session.expire_all()
    return list(session.scalars(select(Decision).where(Decision.id.in_(result.decisions)).order_by(Decision.id)))


def _carry_out(session: Session, decision: Decision, at: datetime, settings: Settings) -> None:
    """The scheduler does it; a node taken out is repaired (rebooted, replaced) and put back."""
    lifecycle.acknowledge(
        session, decision_id=decision.id, outcome="done", message="done", actor="sched", now=at, settings=settings
    )
    node = session.scalar(select(Node).where(Node.name == NODE))
    assert node is not None
    if node.state != "healthy":
        nodes.return_to_service(
            session, name=NODE, reason="back", diagnostics=None, force=True, actor="ops", now=at, settings=settings
        )
    session.flush()


def test_a_gpu_faulting_again_after_each_remedy_climbs_one_rung_each_time(session, client, make_token) -> None:
    settings = _settings()
    job = _job(session)
    made: list[Decision] = []
    # A fault every two hours (past the eviction cooldown), each after the last remedy was carried out; the fifth
    # a day after the fourth's vendor replacement came back.
    for k, hours in enumerate((0, 2, 4, 6, 31)):
        at = T0 + timedelta(hours=hours)
        (decision,) = _fault(session, job, at, f"xid-{k}", settings)
        made.append(decision)
        _carry_out(session, decision, at + timedelta(minutes=2), settings)

    steps = [(d.kind, d.gpu_pci, d.evidence["ladder"]["rung"], d.evidence["ladder"]["number"]) for d in made]
    assert steps == [
        ("reset_gpu", "0000:3b:00.0", "reset_gpu", 2),
        ("evict", None, "reboot", 3),
        ("evict", None, "repair", 4),
        ("evict", None, "rma", 5),
        ("reset_gpu", "0000:3b:00.0", "reset_gpu", 2),  # a replaced machine starts afresh
    ]
    reasons = [d.reason for d in made]
    print("\n".join(reasons))
    assert reasons[0].startswith(f"reset GPU 0000:3b:00.0 on {NODE} (not in its GPU inventory")
    assert made[0].evidence["guard_rails"]["ladder"] == "rung 2 of 5 (reset_gpu): no earlier remedy for this fault"
    assert reasons[1] == (
        f"evict {NODE} to reboot it, rung 3 of 5 (reboot): 2nd GPU fault in 24 h, 2 h after the GPU reset at 08:00: "
        f"it did not hold; Xid 119 (GSP RPC timeout) on {NODE} GPU {PCI}"
    )
    assert reasons[2] == (
        f"evict {NODE} for repair, rung 4 of 5 (repair): 3rd GPU fault in 24 h, 2 h after the node reboot at 10:00: "
        f"it did not hold; Xid 119 (GSP RPC timeout) on {NODE} GPU {PCI}"
    )
    assert reasons[3].startswith(
        f"evict {NODE} for a vendor replacement (RMA), rung 5 of 5 (rma): 4th GPU fault in 24 h, 2 h after the "
        "repair at 12:00: it did not hold"
    )
    # The evidence says it too, for the UI and the scheduler's tools.
    assert made[2].evidence["ladder"] == {
        "rung": "repair",
        "number": 4,
        "of": 5,
        "base": "reboot",  # the GPU reset limit alone would have evicted it: the reset did not hold
        "why": "3rd GPU fault in 24 h, 2 h after the node reboot at 10:00: it did not hold",
    }

    assert made[4].evidence["guard_rails"]["ladder"] == "rung 2 of 5 (reset_gpu): no earlier remedy for this fault"
    # The RMA eviction carried out marked the node for a vendor replacement: when, and why.
    node = session.scalar(select(Node).where(Node.name == NODE))
    assert node is not None
    assert (node.rma_at, node.rma_reason) == (T0 + timedelta(hours=6, minutes=2), made[3].reason)

    token = make_token("scheduler")
    assert client.get("/api/v1/nodes/no-such-node/ladder", headers=bearer(token)).status_code == 404


def test_the_api_lists_each_remedy_and_whether_it_held(session, client, make_token) -> None:
    settings = _settings()
    job = _job(session)
    made = []
    for k, hours in enumerate((0, 2, 4)):
        at = T0 + timedelta(hours=hours)
        (decision,) = _fault(session, job, at, f"xid-{k}", settings)
        made.append(decision)
        _carry_out(session, decision, at + timedelta(minutes=2), settings)
    token = make_token("scheduler")
    body = client.get(f"/api/v1/nodes/{NODE}/ladder", headers=bearer(token)).json()
    # The last repair's hold time may be over by the API's clock: then it held, and the node is at no rung.
    held = True if datetime.now(UTC) >= made[2].created_at + timedelta(seconds=body["thresholds"]["hold_s"]) else None
    assert [(s["decision_id"], s["kind"], s["rung"], s["rung_number"], s["held"]) for s in body["steps"]] == [
        (made[0].id, "reset_gpu", "reset_gpu", 2, False),
        (made[1].id, "evict", "reboot", 3, False),
        (made[2].id, "evict", "repair", 4, held),
    ]
    assert body["steps"][0]["outcome"] == f"did not hold: faulted again at {T0 + timedelta(hours=2):%Y-%m-%d %H:%M}"
    assert body["steps"][1]["reason"] == made[1].reason
    assert (body["rung"], body["rma_at"]) == (("repair", None) if held is None else (None, None))
    assert body["thresholds"]["rma_count"] == 4


def test_a_remedy_that_held_starts_the_ladder_again(session) -> None:
    # A GPU reset, then a day and more without a GPU fault: the next fault is reset again, saying why.
    settings = _settings()
    job = _job(session)
    (first,) = _fault(session, job, T0, "xid-a", settings)
    _carry_out(session, first, T0 + timedelta(minutes=2), settings)
    later = T0 + timedelta(hours=30)
    (second,) = _fault(session, job, later, "xid-b", settings)
    assert (first.kind, second.kind) == ("reset_gpu", "reset_gpu")
    assert second.evidence["guard_rails"]["ladder"] == (
        f"rung 2 of 5 (reset_gpu): the GPU reset at {T0:%Y-%m-%d} 08:00 held (30 h without a GPU fault): "
        "the ladder starts again"
    )


def test_the_ladder_switched_off_leaves_the_reset_rule_alone(session) -> None:
    settings = _settings(policy_ladder_enabled=False)
    job = _job(session)
    (first,) = _fault(session, job, T0, "xid-a", settings)
    _carry_out(session, first, T0 + timedelta(minutes=2), settings)
    (second,) = _fault(session, job, T0 + timedelta(hours=2), "xid-b", settings)
    assert (first.kind, second.kind) == ("reset_gpu", "evict")
    assert "ladder" not in second.evidence and "ladder" not in second.evidence["guard_rails"]
    assert second.reason.startswith(f"evict {NODE}: GPU 0000:3b:00.0 was already reset 1 time in the last 24 h")
