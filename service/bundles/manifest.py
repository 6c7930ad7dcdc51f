"""Read an uploaded bundle's manifest: the first member of the tar.gz, so the service decompresses only that far."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import orjson

from service.errors import InvalidInput

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1024 * 1024


def read_manifest(body: bytes) -> dict[str, Any]:
    """The manifest as a dict; 422 when the body is not a tar.gz whose first member is a JSON object manifest.json."""
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isfile():
                raise InvalidInput(f"a bundle's first member must be the file {MANIFEST}")
            if first.size > MAX_MANIFEST_BYTES:
                raise InvalidInput(f"{MANIFEST} is over {MAX_MANIFEST_BYTES} bytes")
            handle = tar.extractfile(first)
            raw = handle.read() if handle is not None else b""
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidInput(f"the body is not a tar.gz bundle: {exc}") from None
    try:
        manifest = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), list):
        raise InvalidInput(f"{MANIFEST} must be an object with a list of parts")
    return manifest
