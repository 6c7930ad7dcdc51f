"""A local fake Kubernetes API server: just the Node endpoints the Kubernetes adapter uses.

GET /api/v1/nodes/{name}, PATCH /api/v1/nodes/{name} and PATCH /api/v1/nodes/{name}/status, with the
strategic-merge semantics of the fields the adapter sends: node conditions merge by `type`, taints (no
merge key) replace the whole list, `null` deletes a field. The main resource ignores status and the status
subresource ignores spec, as the real API server does. A `metadata.resourceVersion` in a patch is a
precondition (409 when stale). JSON Patch (a list body) and other content types get 415, so a client
sending what we do not expect fails loudly. Unknown nodes get a 404 Status, shaped like the real one.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import orjson

from tests.receiver import serving

PATCH_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json")
_CREATED = "2026-01-05T08:00:00Z"


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge: nested objects merge, `null` deletes, anything else (lists included) replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _merge_conditions(current: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """patchStrategy=merge, patchMergeKey=type: a patched condition updates the one of its type or is added."""
    merged = copy.deepcopy(current)
    for condition in patch:
        existing = next((c for c in merged if c.get("type") == condition.get("type")), None)
        if existing is None:
            merged.append(copy.deepcopy(condition))
        else:
            _merge(existing, condition)
    return merged


@dataclass
class FakeKube:
    url: str = ""
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Every request: method, path, content type, parsed body.
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Called with (method, path) after a PATCH is applied and before it is answered (e.g. to kill something).
    after_patch: Callable[[str, str], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_node(
        self, name: str, *, taints: list[dict[str, Any]] | None = None, unschedulable: bool = False
    ) -> dict[str, Any]:
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "resourceVersion": "1",
                "creationTimestamp": _CREATED,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            },
            "spec": {"podCIDR": "10.244.1.0/24", "providerID": f"fake://{name}"},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": _CREATED,
                        "lastTransitionTime": _CREATED,
                    }
                ],
                "capacity": {"cpu": "96", "memory": "2Ti", "nvidia.com/gpu": "8"},
            },
        }
        if taints is not None:
            node["spec"]["taints"] = taints
        if unschedulable:
            node["spec"]["unschedulable"] = True
        with self.lock:
            self.nodes[name] = node
        return copy.deepcopy(node)

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.node(name)["status"].get("conditions", []) if c["type"] == kind), None)

    def patches(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["method"] == "PATCH"]

    # -- the API -----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, content_type: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        path = path.split("?", 1)[0]
        body = orjson.loads(raw) if raw else None
        with self.lock:
            self.requests.append({"method": method, "path": path, "content_type": content_type, "body": body})
        parts = path.strip("/").split("/")
        if (
            parts[:3] != ["api", "v1", "nodes"]
            or len(parts) not in (4, 5)
            or (len(parts) == 5 and parts[4] != "status")
        ):
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        name, subresource = parts[3], parts[4] if len(parts) == 5 else None
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            if method == "GET":
                return 200, copy.deepcopy(node)
            if method != "PATCH":
                return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")
            if content_type.split(";")[0].strip() not in PATCH_TYPES or not isinstance(body, dict):
                return 415, _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format "
                                    f"({content_type})")  # fmt: skip
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            if subresource == "status":
                patch = dict(body.get("status") or {})
                conditions = patch.pop("conditions", None)
                if conditions is not None:
                    node["status"]["conditions"] = _merge_conditions(node["status"].get("conditions", []), conditions)
                _merge(node["status"], patch)
            else:
                metadata = {k: v for k, v in (body.get("metadata") or {}).items() if k in ("labels", "annotations")}
                _merge(node["metadata"], metadata)
                _merge(node["spec"], body.get("spec") or {})
            node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
            answer = copy.deepcopy(node)
        if self.after_patch is not None:
            self.after_patch(method, path)
        return 200, answer


@contextmanager
def fake_kube() -> Iterator[FakeKube]:
    state = FakeKube()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, body = state.handle(self.command, self.path, self.headers.get("Content-Type", ""), raw)
            payload = orjson.dumps(body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = _serve

        def log_message(self, *_: Any) -> None:
            pass

    with serving(Handler) as url:
        state.url = url
        yield state
