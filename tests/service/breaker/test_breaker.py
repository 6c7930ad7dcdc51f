"""The fleet circuit breaker on the real database: a simulated rule error that accuses 30% of the fleet is stopped at
the configured share, alerts once, and only an operator's reset (API, audited) resumes automation."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.breaker import service as breaker
from service.config import Settings, get_settings
from service.diagnosis.service import DiagnosisResult, _decide
from service.models import BreakerEvent, Decision, FleetBreaker, Job, Node, NotificationChannel, NotificationDelivery
from tests import rows
from tests.conftest import bearer
from tests.decide import finding

FLEET = 40
ACCUSED = 12  # 30% of the fleet
LIMIT = 4  # 10% of it: the default share


def _settings(**changes: Any) -> Settings:
    return get_settings().model_copy(update={"breaker_max_share": 0.10, "breaker_min_nodes": 3, **changes})


def _rule_error(session: Session, nodes: list[Node], *, settings: Settings) -> list[Decision]:
    """A bad rule: every accused node's own job gets a confident finding asking to evict it, pass by pass."""
    made: list[Decision] = []
    for node in nodes:
        job = rows.job(session)
        now = datetime.now(UTC)
        found = finding(node.name, detector="xid", category="gpu_hardware", at=now, key=f"bad-rule-{node.name}")
        result = DiagnosisResult(job_id=job.external_id)
        _decide(session, job=job, findings=[found], result=result, settings=settings, now=now)
        made += session.scalars(select(Decision).where(Decision.id.in_(result.decisions))).all()
    return made


def _fleet(session: Session, size: int) -> list[Node]:
    tag = uuid.uuid4().hex[:6]
    return [rows.node(session, f"fleet-{tag}-{i:03d}") for i in range(size)]


def test_a_rule_error_on_30_percent_of_the_fleet_is_stopped_at_the_share_alerts_once_and_waits_for_a_reset(
    client: Any, session: Session, make_token: Any
) -> None:
    session.add(NotificationChannel(name=f"oncall-{uuid.uuid4().hex[:6]}", kind="json", url="http://127.0.0.1:9/h"))
    fleet = _fleet(session, FLEET)
    settings = _settings()
    client.app.state.settings = settings

    made = _rule_error(session, fleet[:ACCUSED], settings=settings)

    assert [d.kind for d in made] == ["evict"] * ACCUSED
    assert [d.state for d in made] == ["pending"] * LIMIT + ["awaiting_approval"] * (ACCUSED - LIMIT)
    assert "within the limit of 4" in made[LIMIT - 1].evidence["guard_rails"]["fleet_breaker"]
    for held in made[LIMIT:]:
        assert held.evidence["guard_rails"]["fleet_breaker"].startswith("held for a person: the fleet breaker")
    row = session.get_one(FleetBreaker, 1)
    assert (row.state, row.out_nodes, row.fleet_nodes, row.limit_nodes) == ("tripped", LIMIT + 1, FLEET, LIMIT)
    assert fleet[LIMIT].name in (row.tripped_reason or "")
    alerts = session.scalars(select(NotificationDelivery).where(NotificationDelivery.event == "breaker_tripped")).all()
    assert len(alerts) == 1, "one chat alert for the trip, not one per held decision"
    assert alerts[0].payload["title"].startswith("Fleet breaker tripped")

    # The API, as an on-call engineer reads it.
    operator, scheduler, agent = make_token("operator", name="alice"), make_token("scheduler"), make_token("agent")
    state = client.get("/api/v1/breaker", headers=bearer(scheduler)).json()
    assert state["state"] == "tripped" and state["held_decisions"] == ACCUSED - LIMIT
    assert (state["out_now"], state["limit_now"], state["fleet_now"]) == (LIMIT, LIMIT, FLEET)
    assert [e["kind"] for e in state["events"]] == ["tripped"]
    metrics = client.get("/metrics").text
    assert "faultline_breaker_tripped 1.0" in metrics and "faultline_breaker_held_decisions 8.0" in metrics
    assert "faultline_breaker_out_nodes 4.0" in metrics and "faultline_breaker_limit_nodes 4.0" in metrics

    # Only a person with the operator scope resets it, with a reason.
    for token in (scheduler, agent):
        refused = client.post("/api/v1/breaker/reset", json={"reason": "let me"}, headers=bearer(token))
        assert refused.status_code == 403, refused.text
    for body in ({"reason": "   "}, {}, {"reason": "ok", "force": True}):
        bad = client.post("/api/v1/breaker/reset", json=body, headers=bearer(operator))
        assert bad.status_code == 422, bad.text
    assert session.get_one(FleetBreaker, 1).state == "tripped"
    # While it is tripped, the next accusation waits too, and no second alert goes out.
    (more,) = _rule_error(session, fleet[ACCUSED : ACCUSED + 1], settings=settings)
    assert more.state == "awaiting_approval"
    assert session.scalar(select(func.count()).where(NotificationDelivery.event == "breaker_tripped")) == 1

    reset = client.post(
        "/api/v1/breaker/reset", json={"reason": "bad Xid rule reverted (PR 812)"}, headers=bearer(operator)
    )
    assert reset.status_code == 200, reset.text
    after = reset.json()
    assert after["state"] == "closed" and after["reset_by"] == "operator:alice"
    assert after["held_decisions"] == ACCUSED - LIMIT + 1, "a reset leaves the held decisions to a person"
    assert after["out_now"] == 0, "counting starts afresh at the reset"
    audit = session.scalars(select(BreakerEvent).order_by(BreakerEvent.id)).all()
    assert [(e.kind, e.actor) for e in audit] == [("tripped", "faultline"), ("reset", "operator:alice")]
    assert audit[1].reason == "bad Xid rule reverted (PR 812)" and audit[1].details["held_decisions"] == 9
    again = client.post("/api/v1/breaker/reset", json={"reason": "twice"}, headers=bearer(operator))
    assert again.status_code == 409 and "not tripped" in again.json()["message"]

    # Automation resumes: the next accusation goes to the schedulers.
    (resumed,) = _rule_error(session, fleet[ACCUSED + 1 : ACCUSED + 2], settings=settings)
    assert resumed.state == "pending"
    assert "1 of 40 nodes out" in resumed.evidence["guard_rails"]["fleet_breaker"]


def test_nodes_back_in_service_and_a_persons_cordon_do_not_count(session: Session) -> None:
    fleet = _fleet(session, 10)
    settings = _settings()
    done = _rule_error(session, fleet[:3], settings=settings)
    assert [d.state for d in done] == ["pending"] * 3
    for decision in done[:2]:
        decision.state = "done"
    fleet[0].state = "healthy"  # repaired and returned: no longer out
    fleet[1].state = "evicted"
    manual = rows.decision(session, incident=None, node=fleet[3], kind="cordon")  # a person's cordon
    assert manual.state == "pending"
    session.flush()
    assert breaker.out_nodes(session, since=datetime(2000, 1, 1, tzinfo=UTC)) == {fleet[1].name, fleet[2].name}
    (fourth,) = _rule_error(session, fleet[4:5], settings=settings)
    assert fourth.state == "pending", "2 out + this one = 3: within the floor of 3"
    (fifth,) = _rule_error(session, fleet[5:6], settings=settings)
    assert fifth.state == "awaiting_approval"


def test_a_disabled_breaker_never_holds_and_decisions_waiting_for_approval_never_count(session: Session) -> None:
    fleet = _fleet(session, 10)
    off = _rule_error(session, fleet[:5], settings=_settings(breaker_enabled=False))
    assert [d.state for d in off] == ["pending"] * 5
    assert breaker.tripped(session) is None  # switched off: it never trips (its row may not even exist)
    for decision in off:
        decision.state = "rejected"  # a person overruled them: nothing is out
    waiting = _rule_error(session, fleet[5:8], settings=_settings(policy_mode="approval"))
    assert [d.state for d in waiting] == ["awaiting_approval"] * 3
    assert "fleet_breaker" not in waiting[0].evidence["guard_rails"], "approval mode decided first: not the breaker"
    acting = _rule_error(session, fleet[8:10], settings=_settings())
    assert [d.state for d in acting] == ["pending"] * 2
    assert breaker.tripped(session) is None


def test_two_workers_at_once_cannot_both_pass_under_the_limit(committed: Any) -> None:
    """The row lock: the second worker counts after the first commits, so one slot left is taken once."""
    factory = sessionmaker(bind=committed)
    settings = _settings(breaker_min_nodes=1, breaker_max_share=0.01)  # a fleet of 2: one node may be out
    with factory() as session:
        nodes = [rows.node(session, f"race-{i}") for i in range(2)]
        job = rows.job(session)
        incidents = [rows.incident(session, job=job, suspects=[n.name], anchor=n.name) for n in nodes]
        ids = [(n.id, n.name, i.id) for n, i in zip(nodes, incidents, strict=True)]
        job_id = job.id
        session.commit()
    words: dict[str, bool] = {}
    first_admitted = threading.Event()

    def worker(index: int, hold_s: float) -> None:
        node_id, name, incident_id = ids[index]
        with factory() as session:
            (word,) = breaker.admit(session, candidates=[("evict", name)], now=datetime.now(UTC), settings=settings)
            words[name] = word.admitted
            if word.admitted:
                session.add(
                    Decision(incident_id=incident_id, job_id=job_id, node_id=node_id, kind="evict", state="pending",
                             confidence=0.95, reason="race", evidence={})
                )  # fmt: skip
                session.flush()
            first_admitted.set()
            time.sleep(hold_s)  # the first holds the lock a while before it commits
            session.commit()

    a = threading.Thread(target=worker, args=(0, 0.5))
    a.start()
    assert first_admitted.wait(10)
    b = threading.Thread(target=worker, args=(1, 0.0))
    b.start()
    a.join(10)
    b.join(10)
    assert words == {"race-0": True, "race-1": False}
    with factory() as session:
        assert session.scalar(select(FleetBreaker.state)) == "tripped"
        assert session.scalar(select(func.count()).select_from(BreakerEvent)) == 1
        assert session.scalar(select(func.count()).select_from(Job)) == 1
