"""Refuse URLs and headers that carry text PostgreSQL cannot store (NUL) or that is not UTF-8, before any
route runs: such a path or query parameter would otherwise reach a query and fail there as a 500. And
answer Starlette's plain-text 413 (a body over a route's limit) in the API's error shape."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import FaultlineError, InvalidInput, PayloadTooLarge


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
    """ASGI middleware: a 422 in the API's error shape for a request whose URL or headers hold such text;
    a 413 in that shape for a body over its route's limit."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (problem := _problem(scope)) is not None:
            await _answer(send, InvalidInput(problem))
            return
        replaced = False

        async def send_in_our_shape(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 413:
                plain = dict(message.get("headers", [])).get(b"content-type", b"").startswith(b"text/plain")
                if plain:  # the body limit's own answer, raised where no exception handler sees it
                    replaced = True
                    await _answer(send, PayloadTooLarge("the body is larger than this route takes"))
                    return
            if replaced:
                return  # the replaced response's body
            await send(message)

        await self.app(scope, receive, send_in_our_shape)


async def _answer(send: Send, error: FaultlineError) -> None:
    body = orjson.dumps(error.to_dict())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
