"""A firing Xid alert is diagnosed at once by a real worker: no periodic pass needed, as for a kernel Xid."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.config import get_settings
from service.models import Decision, Node
from service.tokens import service as tokens
from tests.conftest import bearer
from tests.procs import running, wait_for, wait_worker_ready
from tests.service.alerts.test_alertmanager_api import URL, notification, running_job, xid79_alert

pytestmark = pytest.mark.slow


def test_a_fatal_xid_alert_is_decided_by_a_real_worker_without_beat(committed, tmp_path) -> None:
    factory = sessionmaker(bind=committed)
    with factory() as session:
        agent = tokens.create(session, scope="agent").token
        operator = tokens.create(session, scope="operator").token
        session.commit()
    with running(["faultline", "work", "--queues", "diagnosis"], log=tmp_path / "worker.log"):
        wait_worker_ready()
        with TestClient(create_app(get_settings(), factory=factory)) as client:
            job = running_job(client, agent)
            response = client.post(URL, json=notification(xid79_alert("node-2")), headers=bearer(operator))
            assert response.status_code == 200, response.text
            assert response.json()["diagnosing"] == [job]

        def evictions() -> list[tuple[Decision, str]]:
            with Session(committed) as session:
                rows = session.execute(
                    select(Decision, Node.name).join(Node, Node.id == Decision.node_id).where(Decision.kind == "evict")
                )
                return [(d, name) for d, name in rows]

        wait_for(lambda: bool(evictions()), timeout=30, what="an eviction decided from the Xid alert")
    ((decision, node),) = evictions()
    assert (decision.state, node) == ("pending", "node-2")
    assert "Xid 79" in decision.reason
