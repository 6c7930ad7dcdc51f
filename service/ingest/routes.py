"""POST /api/v1/ingest: the agents' only write path."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from service.errors import Forbidden
from service.ingest.body import read_body
from service.ingest.schemas import IngestBatch, IngestResult
from service.observability import INGEST_BATCHES, INGEST_ITEMS
from service.security import require_scope
from service.tokens.service import Principal
from service.validation import invalid_from

router = APIRouter(prefix="/api/v1", tags=["ingest"])

_BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "One agent batch, JSON, optionally with `Content-Encoding: gzip`.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
    }
}


@router.post(
    "/ingest",
    response_model=IngestResult,
    openapi_extra=_BODY_DOC,
    responses={
        401: {"description": "Missing, unknown, revoked or expired token"},
        403: {"description": "Not an agent token, or bound to another node"},
        413: {"description": "Body over the configured limit"},
        422: {"description": "Malformed JSON or schema violation; `details` names each field"},
        503: {"description": "Database unavailable: retry with backoff"},
    },
)
async def ingest(request: Request, principal: Annotated[Principal, Depends(require_scope("agent"))]) -> IngestResult:
    """Store one agent batch (idempotent on `batch_id`) and return directives for the agent."""
    body = await read_body(request, limit=request.app.state.settings.ingest_max_body_bytes)
    try:
        batch = IngestBatch.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_from(exc) from None
    if principal.node_name is not None and principal.node_name != batch.node:
        raise Forbidden(f"this token may only write data of node {principal.node_name!r}, not {batch.node!r}")
    outcome = await request.app.state.ingest_writer.submit(batch)
    INGEST_BATCHES.labels("duplicate" if outcome.duplicate else "accepted").inc()
    for kind, count in outcome.stored.items():
        INGEST_ITEMS.labels(kind).inc(count)
    return IngestResult(
        batch_id=batch.batch_id,
        status="duplicate" if outcome.duplicate else "accepted",
        stored=outcome.stored,
    )
