"""The heartbeat's host facts become the node's labels (rack, switch, power domain, driver, firmware and kernel
versions, storage mounts) through ingest; labels of other sources stay; bad facts are a 422 that stores nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Node
from tests.conftest import bearer
from tests.factories import batch

HOST = {
    "driver_version": "560.28.03",
    "kernel": "5.15.0-105-generic",
    "firmware_version": "96.00.99.00.01",
    "rack": "r12",
    "switch": "leaf-7",
    "power_domain": "pdu-3",
    "storage_mounts": ["/mnt/datasets", "/checkpoints", "/mnt/datasets"],
}


def _send(client: Any, agent: dict[str, str], host: dict[str, Any] | None) -> Any:
    payload = batch("lab-node-1", logs=[])
    payload["heartbeat"]["host"] = host
    return client.post("/api/v1/ingest", json=payload, headers=agent)


def test_host_facts_become_labels_and_follow_what_the_agent_reports(
    client: Any, session: Session, make_token: Any
) -> None:
    agent = bearer(make_token("agent"))
    assert _send(client, agent, HOST).status_code == 200
    labels = session.scalar(select(Node.labels).where(Node.name == "lab-node-1"))
    assert labels == {
        "rack": "r12",
        "switch": "leaf-7",
        "power_domain": "pdu-3",
        "driver_version": "560.28.03",
        "firmware_version": "96.00.99.00.01",
        "kernel_version": "5.15.0-105-generic",
        "storage_mounts": ["/checkpoints", "/mnt/datasets"],
    }
    # An operator's own label stays; a fact the agent no longer reports goes.
    session.execute(Node.__table__.update().where(Node.name == "lab-node-1").values(labels={**labels, "team": "llm"}))
    session.flush()
    moved = {**HOST, "switch": "leaf-8", "rack": None, "storage_mounts": []}
    assert _send(client, agent, moved).status_code == 200
    session.expire_all()
    labels = session.scalar(select(Node.labels).where(Node.name == "lab-node-1"))
    assert labels["switch"] == "leaf-8" and labels["team"] == "llm"
    assert "rack" not in labels and "storage_mounts" not in labels
    # A heartbeat without host facts says nothing about them.
    assert _send(client, agent, None).status_code == 200
    session.expire_all()
    assert session.scalar(select(Node.labels).where(Node.name == "lab-node-1"))["switch"] == "leaf-8"


def test_bad_facts_are_refused_whole(client: Any, session: Session, make_token: Any) -> None:
    agent = bearer(make_token("agent"))
    for bad in ({**HOST, "rack": "r" * 129}, {**HOST, "storage_mounts": [""]}, {**HOST, "storage_mounts": ["/m"] * 33}):
        assert _send(client, agent, bad).status_code == 422
    assert session.scalar(select(Node.labels).where(Node.name == "lab-node-1")) is None
