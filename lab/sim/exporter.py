"""dcgm-exporter look-alike: one stdlib HTTP server for all simulated nodes, `/<node>/metrics` each.

The runner publishes a new snapshot after every model step; requests render the latest one (cached per
snapshot), so scrapes never touch the model and never block it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lab.sim import dcgm_fields as F
from lab.sim.gpu import GpuSample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(sample: GpuSample, hostname: str) -> str:
    # dcgm-exporter's label order: gpu, UUID, pci_bus_id, device, modelName, Hostname.
    return (
        f'gpu="{sample.index}",UUID="{sample.uuid}",pci_bus_id="{sample.bus_id}",'
        f'device="nvidia{sample.index}",modelName="{F.MODEL_NAME}",Hostname="{hostname}"'
    )


def render(gpus: Sequence[GpuSample], hostname: str) -> str:
    """Prometheus text exposition of one node's GPUs, in dcgm-exporter's shape and number formatting."""
    labels = [_labels(g, hostname) for g in gpus]
    out: list[str] = []
    for field in F.FIELDS:
        out.append(f"# HELP {field.name} {field.help}")
        out.append(f"# TYPE {field.name} {field.type}")
        for g, lab in zip(gpus, labels, strict=True):
            value = g.values.get(field.name)
            if value is None:
                continue
            text = f"{value:f}" if field.kind == "float" else str(int(value))
            if field.name == "DCGM_FI_DEV_XID_ERRORS":
                code = int(value)
                msg = F.XID_TEXT.get(code, "Unknown Error")
                out.append(f'{field.name}{{{lab},err_code="{code}",err_msg="{msg}"}} {text}')
            else:
                out.append(f"{field.name}{{{lab}}} {text}")
    return "\n".join(out) + "\n"


class MetricsServer:
    """Serves `/<node>/metrics` for every node from the latest published snapshot."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._snapshot: Mapping[str, Sequence[GpuSample]] = {}
        self._version = 0
        self._cache: dict[str, tuple[int, bytes]] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.split("?", 1)[0].strip("/").split("/")
                if len(parts) == 2 and parts[1] == "metrics":
                    body = server.body(parts[0])
                    if body is not None:
                        self._send(200, body)
                        return
                elif parts == [""]:
                    index = "".join(f"/{n}/metrics\n" for n in server.nodes())
                    self._send(200, index.encode())
                    return
                self._send(404, b"not found\n")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # one line per scrape per node would drown the simulator's own output

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sim-exporter", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, node: str) -> str:
        host = self._httpd.server_address[0]
        return f"http://{host}:{self.port}/{node}/metrics"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def publish(self, snapshot: Mapping[str, Sequence[GpuSample]]) -> None:
        with self._lock:
            self._snapshot = snapshot
            self._version += 1

    def nodes(self) -> list[str]:
        with self._lock:
            return list(self._snapshot)

    def body(self, node: str) -> bytes | None:
        with self._lock:
            snapshot, version = self._snapshot, self._version
            cached = self._cache.get(node)
        if node not in snapshot:
            return None
        if cached is not None and cached[0] == version:
            return cached[1]
        body = render(snapshot[node], node).encode()
        with self._lock:
            self._cache[node] = (version, body)
        return body
