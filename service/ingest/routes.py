"""POST /api/v1/ingest: the agents' only write path.

The hottest endpoint (one request per node per interval), so it is served by a middleware ahead of
FastAPI's routing, dependency solving and response-model validation, which together cost more CPU
per request than storing the batch does. Its OpenAPI entry is written out below and merged by the
app factory.
"""

from __future__ import annotations

import orjson
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import Forbidden, ServiceUnavailable, error_response
from service.ingest.body import read_body
from service.ingest.handoff import jobs_with_critical_events, jobs_with_stack_answers
from service.ingest.schemas import IngestBatch
from service.observability import INGEST_BATCHES, INGEST_ITEMS
from service.security import authorize
from service.unknown_lines import record as unknown_lines
from service.validation import invalid_from

PATH = "/api/v1/ingest"
_ACCEPTED = INGEST_BATCHES.labels("accepted")
_DUPLICATE = INGEST_BATCHES.labels("duplicate")
_SHED = INGEST_BATCHES.labels("shed")
_ITEMS = {kind: INGEST_ITEMS.labels(kind) for kind in ("metrics", "node_metrics", "logs", "stacks", "processes")}


async def ingest(request: Request) -> Response:
    """Store one agent batch (idempotent on `batch_id`) and return directives for the agent."""
    principal = await authorize(request, ("agent",))
    body = await read_body(request, limit=request.app.state.settings.ingest_max_body_bytes)
    try:
        batch = IngestBatch.model_validate_json(body, context=request.app.state.settings.time_context)
    except ValidationError as exc:
        raise invalid_from(exc) from None
    if principal.node_name is not None and principal.node_name != batch.node:
        raise Forbidden(f"this token may only write data of node {principal.node_name!r}, not {batch.node!r}")
    outcome = await request.app.state.ingest_writer.submit(batch)
    if not outcome.duplicate:
        trigger = request.app.state.diagnosis_trigger
        if urgent := jobs_with_critical_events(batch):
            await run_in_threadpool(trigger.fire, urgent)
        if full := jobs_with_stack_answers(batch) | jobs_with_critical_events(batch, needing_steps=True):
            await run_in_threadpool(trigger.fire, full, full=True)
    (_DUPLICATE if outcome.duplicate else _ACCEPTED).inc()
    if not outcome.duplicate:
        unknown_lines.observe(batch.logs)
    for kind, count in outcome.stored.items():
        if count:
            _ITEMS[kind].inc(count)
    result = {
        "batch_id": outcome.batch_id,
        "status": "duplicate" if outcome.duplicate else "accepted",
        "stored": outcome.stored,
        "directives": await request.app.state.directives.for_batch(node=batch.node, job_ids=_jobs_of(batch)),
    }
    return Response(orjson.dumps(result), media_type="application/json")


def _jobs_of(batch: IngestBatch) -> list[str | None]:
    """The jobs this node runs, as the batch tells them: directives for them go back to its agent."""
    jobs: list[str | None] = [batch.job_id]
    if batch.heartbeat is not None:
        jobs += batch.heartbeat.jobs
    jobs += [p.job_id for p in batch.processes]
    return jobs


class IngestFastPath:
    """ASGI middleware that answers POST /api/v1/ingest itself and passes everything else on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.in_flight = 0  # ingest requests this process is working on (one event loop: no lock needed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        limit = request.app.state.settings.ingest_max_in_flight
        self.in_flight += 1
        try:
            if self.in_flight > limit:
                # Shed before reading the body: an overloaded process answers at once (the agent retries
                # after Retry-After, its batch safe in its spool) instead of letting every request time out.
                _SHED.inc()
                raise ServiceUnavailable(
                    f"ingest is at capacity ({limit} requests in flight); retry later", retry_after_s=1
                )
            response = await ingest(request)
        except Exception as exc:
            known = error_response(exc)
            if known is None:
                raise
            response = known
        finally:
            self.in_flight -= 1
        await response(scope, receive, send)


def _error(description: str) -> dict[str, object]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


OPENAPI_PATH_ITEM = {
    "post": {
        "tags": ["ingest"],
        "summary": "Ingest one agent batch",
        "description": ingest.__doc__,
        "operationId": "ingest",
        "requestBody": {
            "required": True,
            "description": "One agent batch, JSON, optionally with `Content-Encoding: gzip`. Unknown fields are "
            "ignored, so a newer agent can talk to an older service.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
        },
        "responses": {
            "200": {
                "description": "Stored (`accepted`), or already stored earlier (`duplicate`)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestResult"}}},
            },
            "401": _error("Missing, unknown, revoked or expired token"),
            "403": _error("Not an agent token, or bound to another node"),
            "413": _error("Body over the configured limit (before or after gzip)"),
            "422": _error("Malformed JSON or schema violation; `details` names each field"),
            "503": _error("Database unavailable, or this API process at capacity: retry after Retry-After"),
        },
    }
}
