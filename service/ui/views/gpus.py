"""The GPU inventory a page needs to name GPUs by index (service/ui/formatting.py's GpuNames)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.orm import Session

from service.nodes import service as nodes
from service.ui.formatting import GpuNames


def for_nodes(session: Session, names: Iterable[str | None]) -> GpuNames:
    """GPU names for these nodes (None and repeats skipped): one query."""
    return GpuNames(nodes.gpu_inventory(session, nodes=sorted({n for n in names if n})))
