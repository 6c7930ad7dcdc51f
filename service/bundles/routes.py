"""Evidence bundles: the agent uploads one per `bundle` directive; people and tools list and download them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from service.bundles import service
from service.bundles.schemas import BundleOut
from service.db import session_scope
from service.deps import DbSession
from service.errors import Forbidden
from service.params import Id
from service.request_body import read_capped
from service.security import Principal, authorize, require_scope

router = APIRouter(tags=["bundles"])
Reader = Annotated[Principal, Depends(require_scope("scheduler", "operator", "admin"))]
_NOT_FOUND = {404: {"description": "Unknown incident, node or bundle"}}
_GZIP = "application/gzip"
_BYTES = "application/octet-stream"


@router.put(
    "/api/v1/nodes/{node}/bundles/{bundle_id}",
    status_code=status.HTTP_201_CREATED,
    response_model=BundleOut,
    responses={
        200: {"description": "The same bundle was already stored"},
        401: {"description": "Missing or unknown token"},
        403: {"description": "Not an agent token, or bound to another node"},
        404: {"description": "No bundle of this id was asked of this node"},
        409: {"description": "Already stored with other content"},
        413: {"description": "Over `bundle_max_bytes`"},
        422: {"description": "Not a tar.gz whose first member is manifest.json"},
    },
    openapi_extra={
        # The agent sends application/gzip; any type is read as the archive's bytes (octet-stream too, which
        # generic clients and fuzzers can send).
        "requestBody": {
            "required": True,
            "content": {media: {"schema": {"type": "string", "format": "binary"}} for media in (_GZIP, _BYTES)},
        }
    },
)
async def upload_bundle(node: str, bundle_id: uuid.UUID, request: Request) -> Response:
    """The node's agent uploads the tar.gz it collected for a `bundle` directive (the directive's id), with its agent
    token; manifest.json must be the archive's first member."""
    principal = await authorize(request, ("agent",))
    if principal.node_name is not None and principal.node_name != node:
        raise Forbidden(f"this token may only write data of node {principal.node_name!r}, not {node!r}")
    settings = request.app.state.settings
    body = await read_capped(request, limit=settings.bundle_max_bytes, what="bundle", setting="bundle_max_bytes")

    def _store() -> tuple[BundleOut, bool]:
        with session_scope(request.app.state.sessionmaker) as session:
            return service.store(
                session, node=node, bundle_id=bundle_id, body=body, now=datetime.now(UTC), settings=settings
            )

    out, new = await run_in_threadpool(_store)
    code = status.HTTP_201_CREATED if new else status.HTTP_200_OK
    return JSONResponse(out.model_dump(mode="json"), status_code=code)


@router.get("/api/v1/incidents/{incident_id}/bundles", response_model=list[BundleOut], responses=_NOT_FOUND)
def list_incident_bundles(incident_id: Id, session: DbSession, _: Reader) -> list[BundleOut]:
    """The evidence bundles asked for the incident's decisions: stored (with manifest and download path), still
    collecting, or "no bundle: agent unreachable"."""
    return service.for_incident(session, incident_id=incident_id, now=datetime.now(UTC))


@router.get("/api/v1/nodes/{node}/bundles", response_model=list[BundleOut], responses=_NOT_FOUND)
def list_node_bundles(node: str, session: DbSession, _: Reader) -> list[BundleOut]:
    """The node's latest evidence bundles, newest first."""
    return service.for_node(session, node=node, now=datetime.now(UTC))


@router.get(
    "/api/v1/bundles/{bundle_id}",
    response_class=Response,
    responses={200: {"content": {_GZIP: {}}, "description": "The tar.gz"}, **_NOT_FOUND},
)
def download_bundle(bundle_id: uuid.UUID, session: DbSession, _: Reader) -> Response:
    """Download a stored bundle (tar.gz: manifest.json first, then one file per part)."""
    body, name = service.content(session, bundle_id=bundle_id, now=datetime.now(UTC))
    return Response(body, media_type=_GZIP, headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/api/v1/bundles/{bundle_id}/info", response_model=BundleOut, responses=_NOT_FOUND)
def get_bundle(bundle_id: uuid.UUID, session: DbSession, _: Reader) -> BundleOut:
    """One bundle's state and manifest, without its content."""
    return service.get(session, bundle_id=bundle_id, now=datetime.now(UTC))
