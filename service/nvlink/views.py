"""The API's and the UI's view of NVLink domains, from service.nvlink.service's loading and judging."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy.orm import Session

from ml import nvlink_domains
from service.config import Settings
from service.nvlink import service
from service.nvlink.schemas import CliqueOut, DomainNodeOut, DomainOut


def domains(
    session: Session, *, now: datetime, settings: Settings, clusters: Collection[str] | None = None
) -> list[DomainOut]:
    """Every domain (or these), judged now, as the scheduler API shows it."""
    out = []
    for domain in service.load(session, now=now, settings=settings, clusters=clusters):
        usable = set(domain.usable())
        trays = [n.tray for n in domain.nodes]
        summary = domain.incident.summary if domain.incident is not None else domain.verdict.summary
        out.append(
            DomainOut(
                cluster_uuid=domain.cluster_uuid,
                state=domain.state,
                healthy=domain.healthy,
                summary=summary,
                nodes=[
                    DomainNodeOut(
                        name=n.name,
                        state=n.state,
                        cliques=sorted({g.clique_id for g in n.tray.gpus if g.clique_id is not None}),
                        gpus=len(n.tray.gpus),
                        fabric_manager=n.tray.fabric_manager,
                        trouble=nvlink_domains.tray_trouble(n.tray),
                        usable=n.name in usable,
                        last_seen_at=n.last_seen_at,
                    )
                    for n in domain.nodes
                ],
                cliques=[CliqueOut(clique_id=c, nodes=ns) for c, ns in sorted(nvlink_domains.cliques(trays).items())],
                usable_nodes=[n.name for n in domain.nodes if n.name in usable],
                shared_incident_id=domain.incident.id if domain.incident is not None else None,
            )
        )
    return out
