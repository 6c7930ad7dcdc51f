"""Download an evidence bundle from the web UI (the incident and node pages link here)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fastapi import APIRouter
from starlette.responses import Response

from service.bundles import service as bundles
from service.deps import DbSession
from service.ui.auth import ViewerDep

router = APIRouter(include_in_schema=False)


@router.get("/bundles/{bundle_id}/download")
def download(bundle_id: uuid.UUID, session: DbSession, _: ViewerDep) -> Response:
    body, name = bundles.content(session, bundle_id=bundle_id, now=datetime.now(UTC))
    return Response(
        body, media_type="application/gzip", headers={"Content-Disposition": f'attachment; filename="{name}"'}
    )
