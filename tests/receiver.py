"""A local HTTP receiver standing in for a remote service: scripted answers to POSTs, recorded requests,
and an optional page served to GETs (a dcgm-exporter stand-in)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


@dataclass
class Receiver:
    url: str
    # Answers to give, in order: (status, json body, headers); then `default` for everything else.
    script: list[tuple[int, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    default: tuple[int, dict[str, Any], dict[str, str]] = (200, {"directives": []}, {})
    requests: list[dict[str, Any]] = field(default_factory=list)
    # GET answers with page(n) for the n-th GET (from 1); 404 without a page.
    page: Callable[[int], bytes] | None = None
    gets: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r["body"] for r in self.requests]


@contextmanager
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            with state.lock:
                state.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": orjson.loads(raw) if raw else None}
                )
                status, body, headers = state.script.pop(0) if state.script else state.default
            self._answer(status, orjson.dumps(body), {"Content-Type": "application/json", **headers})

        def do_GET(self) -> None:
            with state.lock:
                state.gets += 1
                n = state.gets
            if state.page is None:
                self._answer(404, b"", {})
            else:
                self._answer(200, state.page(n), {"Content-Type": "text/plain; version=0.0.4"})

        def _answer(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: Any) -> None:
            pass

    with serving(Handler) as url:
        state.url = url
        yield state


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free local port in a thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
