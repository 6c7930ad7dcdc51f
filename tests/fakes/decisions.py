"""Committed decision rows and a scheduler token, for tests that run a scheduler adapter against a real API."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from service.models import Decision, Job, Node
from service.tokens import service as tokens
from tests import rows

NODE_KINDS = ("evict", "cordon", "return", "reset_gpu")


def scheduler_token(engine: Engine, folder: Path, scope: str = "scheduler") -> Path:
    """A committed token, written to a file as the adapter reads it (never on the command line)."""
    with Session(engine) as session:
        token = tokens.create(session, scope=scope, name="adapter under test").token
        session.commit()
    path = folder / "token"
    path.write_text(token + "\n")
    return path


def make_decision(
    engine: Engine,
    *,
    node: str,
    kind: str = "evict",
    reason: str = "Xid 79 (GPU has fallen off the bus) on GPU 3",
    state: str = "pending",
    expires_in_s: float = 1800.0,
    job: str = "llm-pretrain-42",
    gpu: int | None = None,
    gpu_pci: str | None = None,
) -> int:
    """A committed decision; evict/restart/... come with a job and an incident, cordon/return with neither."""
    with Session(engine) as session:
        node_row = session.scalar(select(Node).where(Node.name == node)) or rows.node(session, node)
        incident = None
        if kind not in ("cordon", "return"):
            job_row = session.scalar(select(Job).where(Job.external_id == job)) or rows.job(session, job)
            # One incident per decision keeps the (incident, kind, node) uniqueness out of the way.
            incident = rows.incident(
                session, job=job_row, suspects=[node], root_cause=f"gpu_hardware_{uuid.uuid4().hex[:8]}", summary=reason
            )
        decision = rows.decision(
            session,
            incident=incident,
            node=node_row,
            kind=kind,
            state=state,
            expires_in_s=expires_in_s,
            reason=reason,
            gpu=gpu,
            gpu_pci=gpu_pci,
        )
        session.commit()
        return decision.id


def read_decision(url: str, token_file: Path, decision_id: int) -> dict[str, Any]:
    """The decision as the API shows it."""
    response = httpx.get(
        f"{url}/api/v1/decisions/{decision_id}",
        headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
        timeout=10,
    )
    response.raise_for_status()
    return response.json()


def read_node(url: str, token_file: Path, name: str) -> dict[str, Any]:
    """The node as the API shows it (its state and history)."""
    response = httpx.get(
        f"{url}/api/v1/nodes/{name}", headers={"Authorization": f"Bearer {token_file.read_text().strip()}"}, timeout=10
    )
    response.raise_for_status()
    return response.json()


def decision_state(engine: Engine, decision_id: int) -> str:
    """Straight from the database, for when the API is down."""
    with Session(engine) as session:
        return session.scalar(select(Decision.state).where(Decision.id == decision_id)) or ""
