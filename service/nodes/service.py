"""Nodes: creation on first mention."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.models import Node


def ensure_nodes(session: Session, *, names: set[str]) -> dict[str, int]:
    """Create the nodes that do not exist yet; return name -> id for all of them."""
    ordered = sorted(names)
    session.execute(insert(Node).values([{"name": n} for n in ordered]).on_conflict_do_nothing())
    rows = session.execute(select(Node.name, Node.id).where(Node.name.in_(ordered)))
    return {name: node_id for name, node_id in rows}
