"""Refuse URLs and headers that carry text PostgreSQL cannot store (NUL) or that is not UTF-8, before any
route runs: such a path or query parameter would otherwise reach a query and fail there as a 500."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import InvalidInput


def _problem(scope: Scope) -> str | None:
    for part, raw in (("path", scope.get("raw_path") or scope["path"].encode()), ("query", scope["query_string"])):
        decoded = unquote_to_bytes(raw)
        if b"\x00" in decoded:
            return f"the URL's {part} holds a NUL character"
        try:
            decoded.decode("utf-8")
        except UnicodeDecodeError:
            return f"the URL's {part} is not UTF-8 once percent-decoded"
    for name, value in scope["headers"]:
        if b"\x00" in value:
            return f"header {name.decode('latin-1')!r} holds a NUL character"
    return None


class RejectUnstorableText:
    """ASGI middleware: a 422 in the API's error shape for a request whose URL or headers hold such text."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (problem := _problem(scope)) is not None:
            error = InvalidInput(problem)
            body = orjson.dumps(error.to_dict())
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
