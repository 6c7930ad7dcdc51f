"""Read a request body with a size limit, undoing gzip, before any parsing."""

from __future__ import annotations

import zlib

from fastapi import Request

from service.errors import InvalidInput, PayloadTooLarge
from service.request_body import read_capped


async def read_body(request: Request, *, limit: int) -> bytes:
    body = await read_capped(request, limit=limit)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        return _gunzip(body, limit=limit)
    if encoding not in ("identity", ""):
        raise InvalidInput(f"unsupported Content-Encoding {encoding!r}; send identity or gzip")
    return body


def _gunzip(body: bytes, *, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"body is not valid gzip: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body is over the limit of {limit} bytes")
    if not inflater.eof:
        raise InvalidInput("body is truncated gzip")
    return out
