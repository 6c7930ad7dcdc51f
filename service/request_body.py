"""Read a request body under a size limit: refused with 413 as soon as it is over (declared or streamed), never held
whole. Ingest's batches and the agents' evidence bundles both come in this way."""

from __future__ import annotations

from fastapi import Request

from service.errors import PayloadTooLarge


async def read_capped(request: Request, *, limit: int, what: str = "body", setting: str | None = None) -> bytes:
    """The body's bytes; `what` names it and `setting` the limit's setting in the 413's message."""
    because = f" ({setting})" if setting else ""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"{what} of {declared} bytes is over the limit of {limit} bytes{because}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"{what} is over the limit of {limit} bytes{because}")
        chunks.append(chunk)
    return b"".join(chunks)
